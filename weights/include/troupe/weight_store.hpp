// WeightStore: the actor that serves a WeightPublisher's versions to other processes (and relays
// them down a broadcast tree); WeightSubscriber: the rollout side, which pulls, checks (WS-1)
// and swaps atomically. See troupe/weights.hpp for the design.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "troupe/actor_ref.hpp"
#include "troupe/registry.hpp"
#include "troupe/weight_set.hpp"
#include "troupe/weight_types.hpp"

namespace troupe {

namespace detail::weights { class BufferPool; class GroupTable; }
class WeightStore;

struct SubscriberOptions {
  std::chrono::milliseconds timeout = std::chrono::seconds(120);   // per pull, all buckets
  std::size_t bucket_bytes = std::size_t(64) << 20;   // rounded up to kChecksumChunk
  std::size_t idle_buffers = 2;                       // freed receive buffers kept for reuse
  // false: take the copy path even from a store in this process (tests, benchmarks).
  bool allow_local = true;
  // A store in another process on this host: map its version in place (no copy; the store keeps
  // it, unchanged, until this subscriber drops it or dies) instead of copying it. The mapping is
  // the publisher's memory, shared with every other mapper: never write through its views.
  // Falls back to copying where the memory cannot be mapped (other hosts, TCP-only UCX).
  bool map_shared = true;
  // Hash a mapped version before use (and a version that arrived in device memory by CUDA IPC or
  // NCCL). Off by default: a published version is written once, checksummed by its publisher and
  // never written again while held, so a mapping cannot be torn (WS-1), and device transfers
  // report their own failures; host copies are always checked.
  bool verify_mapped = false;
  // GPU builds, >= 0: pulled versions land in this CUDA device's memory (WeightSet::device()).
  // From a store on this host that mirrors its versions on this device (PublisherOptions::device)
  // the version is imported by CUDA IPC: used in place while held when map_shared, else copied
  // device-to-device; `verify_mapped` then hashes it (a device-to-host pass) before use. From any
  // other store it is pulled to host memory as above, checked, and uploaded. The constructor
  // throws std::invalid_argument when the build has no CUDA or the machine no such device.
  int device = -1;
  // GPU builds, with `device` set: receive versions by NCCL broadcast in the group of this name,
  // of `nccl_group_size` GPUs. The last source (the publisher's store, mirroring its versions on
  // its own GPU) is rank 0, and each subscriber naming the group takes a rank: one GPU each, since
  // NCCL refuses two ranks on one GPU. Every member's pull takes part in a broadcast, and the store
  // broadcasts a version once all members have asked for it, so the members pull together (as in
  // an RL step's weight sync). Joining and each broadcast wait at most `nccl_timeout` for the
  // others (a broadcast: from this member's ask). When the group cannot form or a broadcast fails,
  // the pull goes on by the paths above, and every member gathers again `nccl_retry` later (the
  // store holds the whole group off, so that they come back together). A pull that finds another
  // version's round open takes part in it, then pulls its own version by the other paths; one
  // whose version does not exist goes by the other paths, staying in the group. The constructor throws
  // std::invalid_argument without `device`, with a size below 2, or where NCCL cannot be loaded.
  std::string nccl_group;
  int nccl_group_size = 0;
  std::chrono::milliseconds nccl_timeout = std::chrono::seconds(30);
  std::chrono::milliseconds nccl_retry = std::chrono::seconds(30);
  // Called on the pulling thread after each bucket lands (bytes so far, total: the first `bytes so
  // far` bytes are all in place). May throw to abandon the pull.
  std::function<void(std::size_t, std::size_t)> on_progress;
  // Called on the pulling thread when a copy's receive buffer is ready, before any byte lands:
  // the manifest of the version and the buffer (a relay serves it to its children meanwhile).
  std::function<void(const WeightManifest&, const TensorView&)> on_receive_buffer;
};

// Pulls versions from `sources` (tried in order: a broadcast parent first, then the publisher)
// and holds the current one. pull/update may run on one thread at a time; current() and
// reset() from any thread. Readers keep using the set they loaded until they let go (WS-2).
class WeightSubscriber {
 public:
  explicit WeightSubscriber(std::vector<ActorRef<WeightStore>> sources, SubscriberOptions opts = {});
  explicit WeightSubscriber(ActorRef<WeightStore> source, SubscriberOptions opts = {})
      : WeightSubscriber(std::vector<ActorRef<WeightStore>>{std::move(source)}, std::move(opts)) {}
  ~WeightSubscriber();

  // Version `version` (kLatestVersion: the newest), fetched and checked, without swapping it in.
  // Returns current() when that already is the version asked for (except in an NCCL group, where
  // every pull takes part in a broadcast). Sources are tried in order until one delivers. Throws
  // ErrorException: NotFound (no source has it), Checksum (WS-1: nothing was swapped), Transfer
  // (every source failed).
  WeightSetPtr pull(std::uint64_t version = kLatestVersion);
  // pull(), then makes the result current() atomically.
  WeightSetPtr update(std::uint64_t version = kLatestVersion);
  WeightSetPtr current() const;
  void reset();                         // current() becomes null
  const std::string& id() const { return id_; }

 private:
  struct GroupMember;   // this subscriber's seat and communicator in its NCCL group
  WeightSetPtr pull_from(const ActorRef<WeightStore>& source, std::uint64_t version);
  // The version received by NCCL broadcast in SubscriberOptions::nccl_group; nullptr when the
  // group cannot deliver it now (the other paths then do).
  WeightSetPtr pull_group(std::uint64_t version);
  // The manifest's CUDA IPC handle imported (in place or copied on the device); nullptr when it
  // cannot be opened here (the host path then takes over).
  WeightSetPtr import_device(const WeightManifest& m, const ActorRef<WeightStore>& source,
                             const std::string& pull_id, bool* release_armed);

  std::vector<ActorRef<WeightStore>> sources_;
  SubscriberOptions opts_;
  std::string id_;
  std::vector<char> device_uuid_;       // SubscriberOptions::device's UUID
  std::shared_ptr<detail::weights::BufferPool> pool_;
  std::unique_ptr<GroupMember> group_;  // with SubscriberOptions::nccl_group
  mutable std::mutex mu_;               // guards current_ (short critical sections only)
  WeightSetPtr current_;
};

// The actor face of a WeightPublisher: spawn it beside (colocate_with) the trainer, or in its own
// process; subscribers anywhere pull through it. Every method runs on the actor's thread.
class WeightStore {
 public:
  WeightStore();   // PublisherOptions{}
  // rt.spawn<WeightStore>(actor_options, PublisherOptions{...}): compression, lease, device mirror,
  // and relay_maps for its follow() pulls. Throws std::invalid_argument as WeightPublisher does.
  explicit WeightStore(PublisherOptions opts);
  ~WeightStore();

  // Publishes the tensors as `version` (one copy into shared memory); returns its checksum.
  std::uint64_t publish(std::uint64_t version, std::vector<NamedTensor> tensors);
  // For benchmarks and smoke tests: publishes f32 tensors "w0".."wN" of the given element
  // counts, filled from `seed`, without moving bytes from the caller. Returns the checksum.
  std::uint64_t publish_synthetic(std::uint64_t version, std::vector<std::int64_t> numels,
                                  std::uint64_t seed);
  std::uint64_t latest_version();       // 0 when nothing is published
  // Starts a transfer: pins `version` for `subscriber` (until release() or the lease) and
  // exposes its wire image. When the caller shares this process, or already has the version
  // (`have`), nothing is pinned. Throws ErrorException(WeightCode::NotFound).
  WeightManifest manifest(std::uint64_t version, std::string subscriber, WeightOrigin caller,
                          std::uint64_t have);
  void release(std::uint64_t version, std::string subscriber);
  // Relay (broadcast tree): pulls `version` from the first source that answers and republishes
  // it here unchanged (same version, checksum, wire image) for this store's own children.
  // Returns the checksum. Throws ErrorException (a WeightCode).
  std::uint64_t follow(std::vector<ActorRef<WeightStore>> sources, std::uint64_t version);
  // Pipelined relay (a chain): starts pulling `version` as follow() does, on a thread of its own,
  // and returns at once. While the version arrives, this store serves it to its own children as
  // far as it has landed (manifest() answers `streaming`; they pull each bucket once progress()
  // covers it), so a chain of N relays costs about one transfer plus N-1 buckets. Waits for an
  // earlier follow_async to end first. Its outcome shows in progress(). `version` must be named
  // (std::invalid_argument for kLatestVersion).
  void follow_async(std::vector<ActorRef<WeightStore>> sources, std::uint64_t version);
  // How much of `version` is here. Throws ErrorException: Transfer when this store's pull of it
  // failed, NotFound when it neither has nor is pulling it.
  FollowState progress(std::uint64_t version);
  // The same, answered once `bytes` of `version` are here (at once if they are): when they have
  // landed, when it is complete or its pull failed (Transfer), or when the pull started over into
  // another buffer (`generation` changes: ask again). NotFound when it neither has nor is pulling
  // it. A deferred reply: nobody polls; a caller bounds its wait with its call's timeout.
  Future<FollowState> landed(std::uint64_t version, std::uint64_t bytes);
  void clear();                         // forget the latest (and a relay's copy)
  PublisherStats stats();

  // NCCL group broadcast (GPU builds; this store mirrors its versions on a GPU, the fourth
  // constructor argument). The store is rank 0 of group `group` of `size` GPUs; each subscriber
  // with SubscriberOptions::nccl_group calls this until its seat is `ready`: the group is formed
  // once size-1 members are asking together (one that stopped asking for 250 ms has gone). Then
  // each joins the communicator with the seat's id and rank, and the store joins on a thread of
  // its own; every wait of the group's is bounded by `timeout_ms`. A member joining again (its
  // communicator failed), a new member or another size gathers the group anew (a new epoch).
  // While the group is held off (group_leave), the seat says for how long (retry_in_ms); if
  // forming fails here, it is held off for `retry_ms`. Throws std::invalid_argument without a
  // device mirror, with size < 2 or bad times, std::runtime_error when NCCL cannot be used.
  GroupSeat group_join(std::string group, std::int32_t size, std::string member, std::int64_t timeout_ms,
                       std::int64_t retry_ms);
  // A member gives up (it timed out gathering, or its communicator failed): it leaves the
  // gathering, a formed group it is seated in is gathered anew, and with `retry_ms` > 0 no member
  // gathers again before then (they all come back together).
  void group_leave(std::string group, std::string member, std::int64_t retry_ms);
  // A member asks for `version` by broadcast: it opens a round on it, or takes part in the open
  // round whatever version that is (every rank must take part). Once every member has asked, the
  // store broadcasts the round's device image, and each member receives it with ncclBroadcast.
  // Returns the round's manifest (device_checksum: the image's checksum; nothing is pinned for the
  // caller, the group holds the version until it is sent). Throws ErrorException: Rejoin (no
  // such group or epoch, or the group broke: join again), NotFound (no round was open).
  WeightManifest group_pull(std::string group, std::uint64_t epoch, std::uint64_t version, std::string member);

  const std::shared_ptr<WeightPublisher>& publisher() const { return publisher_; }

 private:
  struct Stream;
  // follow() and follow_async(): one pull at a time, on this thread (`here`) or the stream's.
  void start_pull(std::vector<ActorRef<WeightStore>> sources, std::uint64_t version, bool here);
  WeightManifest streaming_manifest(const WeightManifest& arriving, const TensorView& wire,
                                    const std::string& subscriber, std::uint64_t have);

  std::shared_ptr<WeightPublisher> publisher_;
  std::shared_ptr<Stream> stream_;            // a relay's pull and what it serves meanwhile
  std::shared_ptr<std::atomic<std::uint64_t>> group_broadcasts_ = std::make_shared<std::atomic<std::uint64_t>>(0);
  std::unique_ptr<detail::weights::GroupTable> groups_;   // NCCL groups, made on the first group_join
};

// Sends `version` (published at `publisher`) down a chain: relays[0] follows the publisher,
// relays[k] follows relays[k-1] (the publisher as fallback), each serving what it has received
// to the next while it receives (follow_async). Returns once every relay has the version
// complete; throws ErrorException(WeightCode::Transfer) past `timeout`, CallError when a relay's
// pull failed.
void chain_broadcast(const ActorRef<WeightStore>& publisher, const std::vector<ActorRef<WeightStore>>& relays,
                     std::uint64_t version, std::chrono::milliseconds timeout = std::chrono::seconds(120));

// Receiver k of n in a broadcast tree rooted at the publisher with `fanout` children per node:
// the sources to follow, parent first, then the publisher as the fallback. `relays[k]` is
// receiver k's own WeightStore.
std::vector<ActorRef<WeightStore>> tree_sources(const ActorRef<WeightStore>& publisher,
                                                const std::vector<ActorRef<WeightStore>>& relays,
                                                std::size_t k, std::size_t fanout = 2);

}  // namespace troupe

TROUPE_ACTOR(troupe::WeightStore, publish, publish_synthetic, latest_version, manifest, release,
             follow, follow_async, progress, landed, clear, stats, group_join, group_leave, group_pull);
