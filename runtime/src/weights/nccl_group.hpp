// The root side of a WeightStore's NCCL group (WeightStore::group_join / group_pull): rank 0 of a
// communicator over the store's GPU and its members' GPUs, which broadcasts a version's device
// image once every member has asked for it.
//
// Rounds: the first member to ask names the round's version (a named one, or the latest then);
// the others must ask for the same one (or "latest"). When all size-1 members have asked, the
// group's thread broadcasts the version from the publisher's device mirror while the members
// receive it into buffers of their own; meanwhile the next round may start. A round that does not
// fill within the timeout, a broadcast that fails, or NCCL refusing the group (two ranks on one
// GPU) breaks the group for good: every later ask fails with the reason, and members form a new
// group (group_join) on a later pull, falling back to the store's other paths until then.
//
// Thread safety: every method may be called from any thread (the store's actor thread); the
// group's own thread joins the communicator and runs the broadcasts.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "troupe/weight_set.hpp"

namespace troupe::detail::weights {

class GroupRoot {
 public:
  // Makes the group's NCCL id and starts its thread, which joins as rank 0 on `device`.
  // `broadcasts` counts the broadcasts completed (shared with the store's stats). Throws
  // std::runtime_error when NCCL cannot be used here.
  GroupRoot(std::string name, int size, int device, std::chrono::milliseconds timeout, std::uint64_t epoch,
            std::shared_ptr<std::atomic<std::uint64_t>> broadcasts);
  ~GroupRoot();   // stops the thread, aborting a join or broadcast in flight
  GroupRoot(const GroupRoot&) = delete;
  GroupRoot& operator=(const GroupRoot&) = delete;

  const std::array<char, 128>& id() const { return id_; }
  std::uint64_t epoch() const { return epoch_; }
  int size() const { return size_; }
  // A seat for `member`: its rank (1 .. size-1), or 0 when every seat is taken or `member` has one
  // already (it is joining again: the caller forms a new group).
  int seat(const std::string& member);
  // `member` asks for `version` (kLatestVersion: whatever the round is on, or the latest when it
  // opens the round); `resolve` finds a published version. Returns the round's set, whose device
  // image the member must now receive. Throws WeightError: Transfer (the group is broken, the
  // member has no seat, or the round is on another version), NotFound (from `resolve`).
  WeightSetPtr ask(const std::string& member, std::uint64_t version,
                   const std::function<WeightSetPtr(std::uint64_t)>& resolve);
  std::string broken() const;   // why the group cannot be used ("" while it can)

 private:
  void run();
  void fail_locked(const std::string& why);

  const std::string name_;
  const int size_, device_;
  const std::chrono::milliseconds timeout_;
  const std::uint64_t epoch_;
  std::array<char, 128> id_{};
  std::shared_ptr<std::atomic<std::uint64_t>> broadcasts_;
  std::atomic<bool> stop_{false};

  mutable std::mutex mu_;
  std::condition_variable changed_;
  std::set<std::string> seated_;
  WeightSetPtr round_;                       // the version of the open round
  std::set<std::string> asked_;              // members that asked for it
  std::chrono::steady_clock::time_point opened_;
  std::string broken_;
  std::thread thread_;
};

}  // namespace troupe::detail::weights
