// The scheduler: where every actor and every placement-group bundle goes.
//
// Thread safety: none. One Scheduler is one single-threaded state machine; the caller (the
// head, or the Simulator) serializes every call. All methods return errors as values.
//
// Default actor policy (no bundle) is Ray's hybrid policy: a node's score is its critical
// utilization, the largest used/total over its resources. Pack onto the most utilized node
// that stays at or under `spread_threshold` after the placement; when no node qualifies,
// spread onto the least utilized node that fits. Requests without GPUs avoid GPU nodes while
// any other node fits. Why: packing keeps whole nodes free for big requests (and for scale
// down) until the cluster is half busy; past that, spreading limits interference.
// Nodes are indexed by shape (their set of resource names) and by utilization in 1% buckets,
// so a decision probes a handful of nodes instead of scanning all of them; only when the
// probes find nothing (a nearly full or fragmented cluster) does it fall back to a full scan,
// so a node that fits is never missed.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "troupe/placement/labels.hpp"
#include "troupe/placement/node.hpp"
#include "troupe/placement/placement_group.hpp"
#include "troupe/placement/resources.hpp"
#include "troupe/placement/status.hpp"

namespace troupe::placement {

struct SchedulerOptions {
  double spread_threshold = 0.5;  // Ray's scheduler_spread_threshold
  bool avoid_gpu_nodes = true;    // CPU-only requests use GPU nodes only when nothing else fits
  int probes_per_bucket = 4;      // nodes examined per utilization bucket before moving on
};

// Bundle i of group `group`; index -1 means "any bundle with room" (first by index).
struct BundleRef {
  PlacementGroupId group = 0;
  int index = -1;
  bool operator==(const BundleRef&) const = default;
};

struct ActorRequest {
  ActorId actor = 0;
  Resources resources;                 // may be empty (a zero-resource actor)
  std::optional<BundleRef> bundle;     // place inside a reserved bundle
  bool colocate = false;               // share the bundle's one worker process (needs a bundle index)
  LabelSelector selector;              // node-label constraints
  // Hard node affinity: this node or nothing (Ray's NodeAffinitySchedulingStrategy, soft=False);
  // with a bundle, a bundle reserved on this node. The head uses it to restore a recorded placement.
  std::optional<NodeId> node;
};

// The worker process an actor runs in: colocated actors of one bundle share one key; every
// other actor gets a key of its own. `process` is unique within this Scheduler.
struct WorkerKey {
  NodeId node = 0;
  std::uint64_t process = 0;
  bool operator==(const WorkerKey&) const = default;
};

struct Placement {
  ActorId actor = 0;
  NodeId node = 0;
  WorkerKey worker;
  std::optional<BundleRef> bundle;     // with the resolved index
  std::vector<GpuShare> gpus;          // which devices, for CUDA_VISIBLE_DEVICES
};

// What a node's death cost. Lost actors are gone from the scheduler; the runtime restarts
// them (into the same bundle when they had one, once the group is kCreated again).
struct NodeLoss {
  std::vector<ActorId> lost_actors;
  std::vector<PlacementGroupId> re_reserved;   // lost bundles already reserved elsewhere
  std::vector<PlacementGroupId> rescheduling;  // lost bundles waiting for room
};

class Scheduler {
 public:
  explicit Scheduler(SchedulerOptions options = {});
  ~Scheduler();
  Scheduler(Scheduler&&) noexcept;
  Scheduler& operator=(Scheduler&&) noexcept;

  // Nodes. add_node fails with kAlreadyExists for a known or dead id (FT-3). Adding room
  // retries pending groups. drain_node stops new placements on the node; mark_dead releases
  // everything on it and re-reserves its bundles elsewhere before anything else gets the room.
  Status add_node(NodeId id, Resources total, Labels labels = {});
  Status drain_node(NodeId id);
  Result<NodeLoss> mark_dead(NodeId id);

  // Placement groups (PG-1, PG-2). Removal releases every bundle and returns the actors that
  // were placed in the group: the caller kills them; they are already released here.
  Result<CreateResult> create_placement_group(PlacementGroupSpec spec);
  Result<std::vector<ActorId>> remove_placement_group(PlacementGroupId id);
  // Re-creates a group recorded elsewhere (the head's store) under its own id, each bundle on the
  // node it was reserved on (nullopt: it was not reserved). A bundle whose node is gone or has no
  // room now waits as after a node loss: the group is kRescheduling (kPending when no bundle could
  // be restored) and retried as room appears. Later groups get ids above every restored one.
  // Errors: kAlreadyExists (the id is taken), kInvalidArgument (as create, or the sizes differ).
  Result<CreateResult> restore_placement_group(PlacementGroupId id, PlacementGroupSpec spec,
                                               const std::vector<std::optional<NodeId>>& bundle_nodes);
  // Groups that became kCreated since the last call (from pending or rescheduling), in order.
  std::vector<PlacementGroupId> take_ready_groups();

  // Actors. place_actor errors: kInvalidArgument (bad request), kAlreadyExists, kNotFound
  // (unknown group), kFailedPrecondition (bundle not reserved), kInfeasible, kUnavailable.
  Result<Placement> place_actor(const ActorRequest& request);
  Status release_actor(ActorId id);

  // Snapshots, for the head's directory and for tests.
  std::optional<NodeView> node(NodeId id) const;
  std::optional<GroupView> group(PlacementGroupId id) const;
  std::optional<Placement> actor(ActorId id) const;
  std::vector<NodeId> node_ids(bool alive_only = true) const;
  std::vector<PlacementGroupId> group_ids() const;
  std::size_t actor_count() const;

  // Recomputes every node's and bundle's accounting from scratch and checks PG-1 and PG-2
  // and the strategies' node constraints. O(cluster); for tests and the simulator.
  Status validate() const;

  struct Impl;  // opaque; defined in src/, named here only so internal helpers can take it

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace troupe::placement
