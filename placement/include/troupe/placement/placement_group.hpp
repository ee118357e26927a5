// Placement groups: bundles of resources reserved together, with Ray's four strategies.
//
// PG-1: a group is reserved whole or not at all. The one sanctioned partial state is
// kRescheduling: a node holding some bundles died, the survivors stay reserved (their actors
// keep running) and the lost bundles wait, as one all-or-nothing unit, for new room.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "troupe/placement/labels.hpp"
#include "troupe/placement/node.hpp"
#include "troupe/placement/resources.hpp"
#include "troupe/placement/status.hpp"

namespace troupe::placement {

enum class Strategy {
  kPack,          // as few nodes as possible; several nodes allowed
  kSpread,        // distinct nodes where possible; sharing allowed
  kStrictPack,    // every bundle on one node, or fail
  kStrictSpread,  // every bundle on a distinct node, or fail
};
// "PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD".
std::string_view to_string(Strategy strategy);
Result<Strategy> parse_strategy(std::string_view text);

struct PlacementGroupSpec {
  std::vector<Resources> bundles;  // each non-empty; GPU amounts < 1 or whole
  Strategy strategy = Strategy::kPack;
  LabelSelector selector;          // every bundle's node must match; empty = any node
  // When the group cannot be placed now: true keeps it pending and places it as soon as room
  // appears (reported by Scheduler::take_ready_groups); false returns the error and keeps nothing.
  bool wait_if_unplaced = true;
  std::string name;                // for messages only
};

enum class GroupState {
  kPending,       // nothing reserved yet; waiting for room
  kCreated,       // every bundle reserved
  kRescheduling,  // some bundles lost with a dead node; survivors held; waiting for room
};
std::string_view to_string(GroupState state);

// What create_placement_group did.
struct CreateResult {
  PlacementGroupId id = 0;
  GroupState state = GroupState::kPending;
  // Ok when created; otherwise why it is pending (kInfeasible: no node could ever hold it as
  // the cluster stands; kUnavailable: it fits the totals but not what is free now).
  Status reason;
};

// A read-only snapshot of one group.
struct GroupView {
  PlacementGroupId id = 0;
  std::string name;
  Strategy strategy = Strategy::kPack;
  GroupState state = GroupState::kPending;
  std::vector<Resources> bundles;
  std::vector<std::optional<NodeId>> bundle_nodes;  // nullopt while that bundle is unreserved
  std::vector<Resources> bundle_available;          // bundle total minus its actors
  std::vector<ActorId> actors;
};

}  // namespace troupe::placement
