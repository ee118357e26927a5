// The store side of NCCL group broadcasts (WeightStore::group_join / group_pull).
//
// Forming: members poll group_join; a group is formed (its NCCL id made, its seats given) only
// once size-1 members are present together, so that no rank waits alone in NCCL's join, and NCCL
// resources are spent only on groups that can complete. A member not seen for a moment has gone
// (died, or fell back to the store's other paths) and is dropped from the gathering; one that
// gives up says so (group_leave), so that a poll of its still queued here cannot count it.
//
// GroupRoot: rank 0 of a formed group, on the store's GPU. Rounds: the first member to ask names
// the round's version (a named one, or the latest then); a member asking while a round is open
// takes part in that round whatever it asked for (a collective needs every rank), and pulls its
// own version by the other paths afterwards. When all size-1 members have asked, the group's
// thread broadcasts the version from the publisher's device mirror while the members receive it
// into buffers of their own; the next round may open meanwhile. A round that does not fill within
// the timeout, a broadcast that fails, or NCCL refusing the group (two ranks on one GPU) breaks
// the group for good: every later ask fails with the reason, and the members gather anew.
//
// GroupTable: a store's groups by name, used on the store's actor thread only. A member that
// gives up after a failure holds the whole group off for its retry time (every member is told the
// same, so they come back together). Groups it replaces are destroyed on threads of their own,
// since aborting an NCCL communicator blocks.
//
// Left to NCCL: a rank that was seated but never joins (died in between) leaves NCCL's bootstrap
// thread of that group waiting in the store's process; each such formation costs one.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "troupe/weight_set.hpp"
#include "troupe/weight_types.hpp"

namespace troupe::detail::weights {

// Members gathering to form a group of `size` ranks (the store and size-1 members). Bookkeeping
// only, no NCCL.
class Forming {
 public:
  using Clock = std::chrono::steady_clock;
  Forming(int size, std::chrono::milliseconds stale) : size_(size), stale_(stale) {}
  int size() const { return size_; }
  // `member` is here at `now`; members not seen for `stale` are dropped first. True once size-1
  // members are present.
  bool arrive(const std::string& member, Clock::time_point now);
  void depart(const std::string& member) { seen_.erase(member); }
  // The members present, in rank order (rank = index + 1).
  std::vector<std::string> members() const;

 private:
  int size_;
  std::chrono::milliseconds stale_;
  std::map<std::string, Clock::time_point> seen_;
};

class GroupRoot {
 public:
  // Makes the group's NCCL id, seats `members` (rank = index + 1) and starts its thread, which
  // joins as rank 0 on `device`. `broadcasts` counts the broadcasts completed (the store's stats).
  // Throws std::runtime_error when NCCL cannot be used here.
  GroupRoot(std::string name, int device, std::vector<std::string> members, std::chrono::milliseconds timeout,
            std::uint64_t epoch, std::shared_ptr<std::atomic<std::uint64_t>> broadcasts);
  ~GroupRoot();   // stops the thread, aborting a join or broadcast in flight (blocks while NCCL aborts)
  GroupRoot(const GroupRoot&) = delete;
  GroupRoot& operator=(const GroupRoot&) = delete;

  const std::array<char, 128>& id() const { return id_; }
  std::uint64_t epoch() const { return epoch_; }
  int size() const { return int(members_.size()) + 1; }
  // `member`'s rank the first time it claims its seat; 0 when it has no seat or claimed it before
  // (it is joining again: the group must be formed anew).
  int claim(const std::string& member);
  bool seated(const std::string& member) const;
  // `member` asks for `version`: it opens a round on it (kLatestVersion: the latest; `resolve`
  // finds a published version) or takes part in the open round, whatever its version. Returns the
  // round's set, whose device image the member must now receive. Throws ErrorException: Rejoin
  // (the group is broken, the member has no seat), NotFound (from `resolve`: no round was opened).
  WeightSetPtr ask(const std::string& member, std::uint64_t version,
                   const std::function<WeightSetPtr(std::uint64_t)>& resolve);
  std::string broken() const;   // why the group cannot be used ("" while it can)

 private:
  void run();
  // Breaks the group; the open round's set moves to `dropped`, to be freed outside the lock.
  void fail_locked(const std::string& why, WeightSetPtr* dropped);

  const std::string name_;
  const int device_;
  const std::vector<std::string> members_;
  const std::chrono::milliseconds timeout_;
  const std::uint64_t epoch_;
  std::array<char, 128> id_{};
  std::shared_ptr<std::atomic<std::uint64_t>> broadcasts_;
  std::atomic<bool> stop_{false};

  mutable std::mutex mu_;
  std::condition_variable changed_;
  std::set<std::string> claimed_;
  WeightSetPtr round_;                       // the version of the open round
  std::set<std::string> asked_;              // members that asked for it
  std::chrono::steady_clock::time_point opened_;
  std::string broken_;
  std::thread thread_;
};

class GroupTable {
 public:
  GroupTable(int device, std::shared_ptr<std::atomic<std::uint64_t>> broadcasts)
      : device_(device), broadcasts_(std::move(broadcasts)) {}
  ~GroupTable();   // waits for replaced groups to finish aborting
  // WeightStore::group_join: `member` is here to join `group` of `size` ranks. Its seat once the
  // group is formed (ready); else ready = false: poll again, or, with retry_in_ms, come back then.
  // `retry`: how long the group is held off if forming it fails here.
  GroupSeat join(const std::string& group, int size, const std::string& member, std::chrono::milliseconds timeout,
                 std::chrono::milliseconds retry);
  // WeightStore::group_leave: `member` gave up. It leaves the gathering; a formed group it has a
  // seat in is gathered anew; with `hold_off` > 0 nobody gathers again before that.
  void leave(const std::string& group, const std::string& member, std::chrono::milliseconds hold_off);
  // The formed group `group` of `epoch`; nullptr when it is gone (replaced or never formed).
  GroupRoot* find(const std::string& group, std::uint64_t epoch);

 private:
  void retire(std::unique_ptr<GroupRoot> root);

  struct Entry {
    std::unique_ptr<GroupRoot> root;
    std::optional<Forming> forming;
    Forming::Clock::time_point not_before{};   // held off until then
  };
  const int device_;
  std::shared_ptr<std::atomic<std::uint64_t>> broadcasts_;
  std::map<std::string, Entry> groups_;
  std::uint64_t epochs_ = 0;
  std::vector<std::future<void>> retiring_;
};

}  // namespace troupe::detail::weights
