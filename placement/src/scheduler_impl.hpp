// Scheduler internals shared by scheduler.cpp (nodes, actors, index) and placement_group.cpp
// (placement groups). Nodes live in slots (indices into nodes_) that are never reused.
#pragma once

#include <array>
#include <bitset>
#include <cstdint>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "gpu_pool.hpp"
#include "troupe/placement/scheduler.hpp"

namespace troupe::placement {

namespace detail {

inline constexpr int kBuckets = 101;  // utilization in whole percent, 0..100
inline constexpr std::uint32_t kNoSlot = UINT32_MAX;

struct NodeRec {
  NodeId id = 0;
  NodeState state = NodeState::kAlive;
  Resources total;
  Resources available;
  Labels labels;
  GpuPool gpus;
  int shape = 0;             // index into shapes_
  double score = 0;          // critical utilization, max over resources of used/total
  int bucket = -1;           // -1 when not indexed (draining or dead)
  std::uint32_t pos = 0;     // position inside its bucket
  std::vector<ActorId> actors;                                // actors outside groups
  std::vector<std::pair<PlacementGroupId, int>> bundles;      // bundles reserved here
};

// Nodes with the same set of resource names, bucketed by utilization.
struct Shape {
  Resources names;           // each name with amount 1
  bool has_gpu = false;
  std::array<std::vector<std::uint32_t>, kBuckets> buckets;
  std::bitset<kBuckets> nonempty;
};

struct BundleRec {
  Resources total;
  Resources available;       // total minus the actors placed in it
  std::uint32_t slot = kNoSlot;
  std::vector<GpuShare> node_gpus;  // slices of the node's devices this bundle holds
  GpuPool gpus;                     // the same slices, minus its actors' slices
  std::uint64_t worker = 0;         // the colocated worker process of this reservation
  std::vector<ActorId> actors;
};

struct GroupRec {
  PlacementGroupId id = 0;
  std::string name;
  Strategy strategy = Strategy::kPack;
  LabelSelector selector;
  GroupState state = GroupState::kPending;
  std::vector<BundleRec> bundles;
};

struct ActorRec {
  Placement placement;
  Resources resources;
  std::uint32_t slot = kNoSlot;
  std::size_t pos = 0;       // position in its node's or bundle's actor list
};

// What a candidate node must offer: aggregate resources, device-level GPU slices, labels,
// and not being one of `exclude`.
struct Demand {
  Resources total;
  std::vector<Quantity> gpu_parts;
  const LabelSelector* selector = nullptr;
  const std::vector<std::uint32_t>* exclude = nullptr;
};

// kInvalidArgument for negative amounts or a GPU amount above 1 that is not whole.
Status check_amounts(const Resources& r, const std::string& what);

}  // namespace detail

struct Scheduler::Impl {
  explicit Impl(SchedulerOptions o) : options(o) {}

  // --- node index (scheduler.cpp) ---
  void index_insert(std::uint32_t slot);
  void index_erase(std::uint32_t slot);
  void index_refresh(std::uint32_t slot);  // after `available` changed
  bool fits(std::uint32_t slot, const detail::Demand& d) const;
  double post_score(std::uint32_t slot, const Resources& add) const;
  // The node the hybrid policy picks for `d`, or kNoSlot when no alive node fits.
  std::uint32_t pick_node(const detail::Demand& d) const;
  std::uint32_t pick_in_shapes(const detail::Demand& d, const std::vector<int>& shapes) const;
  std::uint32_t probe_shape(const detail::Demand& d, const detail::Shape& s) const;
  std::uint32_t scan_best(const detail::Demand& d, const std::vector<std::uint32_t>& slots) const;
  // True when some alive node could hold `d` if it were empty.
  bool fits_some_total(const detail::Demand& d) const;
  void take_from_node(std::uint32_t slot, const Resources& r);
  void give_to_node(std::uint32_t slot, const Resources& r);

  // --- placement groups (placement_group.cpp) ---
  // Reserves every bundle in `todo` or none (PG-1), honouring the bundles of `g` already held.
  bool place_bundles(detail::GroupRec& g, std::vector<int> todo);
  bool place_strict_spread(detail::GroupRec& g, const std::vector<int>& todo);
  bool place_greedy(detail::GroupRec& g, const std::vector<int>& todo);
  bool place_on_one(detail::GroupRec& g, const std::vector<int>& todo);
  void reserve_bundle(detail::GroupRec& g, int index, std::uint32_t slot);
  void unreserve_bundle(detail::GroupRec& g, int index);  // node accounting only if alive
  Status explain_unplaced(const detail::GroupRec& g, const std::vector<int>& todo) const;
  void retry_waiting();
  std::vector<std::uint32_t> group_slots(const detail::GroupRec& g) const;

  // --- actors ---
  void erase_actor(ActorId id, bool return_resources);
  Result<Placement> place_in_bundle(const ActorRequest& req, detail::ActorRec& rec);
  Result<Placement> place_on_node(const ActorRequest& req, detail::ActorRec& rec);
  // Forgets a dead node's actors (appended to `lost`) and bundles; returns the groups hit.
  std::set<PlacementGroupId> release_dead_node(std::uint32_t slot, std::vector<ActorId>& lost);

  SchedulerOptions options;
  std::vector<detail::NodeRec> nodes;
  std::unordered_map<NodeId, std::uint32_t> slot_of;
  std::vector<detail::Shape> shapes;
  std::unordered_map<std::string, std::vector<std::uint32_t>> label_index;  // "k=v" -> alive slots
  std::unordered_map<PlacementGroupId, detail::GroupRec> groups;
  std::set<PlacementGroupId> pending;       // kPending, FIFO by id
  std::set<PlacementGroupId> rescheduling;  // kRescheduling, served before pending
  std::vector<PlacementGroupId> ready;      // for take_ready_groups
  std::unordered_map<ActorId, detail::ActorRec> actors;
  Resources free_total;                     // sum of alive nodes' available
  PlacementGroupId next_group = 1;
  std::uint64_t next_worker = 1;
};

}  // namespace troupe::placement
