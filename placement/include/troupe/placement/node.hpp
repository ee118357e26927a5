// Nodes as placement sees them: capacity, what is free, labels, liveness.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "troupe/placement/labels.hpp"
#include "troupe/placement/resources.hpp"

namespace troupe::placement {

// Chosen by the caller (the head); never reused: a node that comes back joins under a new id (FT-3).
using NodeId = std::uint64_t;
using ActorId = std::uint64_t;
using PlacementGroupId = std::uint64_t;  // assigned by the Scheduler, increasing from 1

enum class NodeState {
  kAlive,     // takes new actors and bundles
  kDraining,  // keeps what it holds, takes nothing new (leaving gracefully)
  kDead,      // gone; its actors and bundles were released (FT-3: stays dead)
};
std::string_view to_string(NodeState state);

// A slice of one physical GPU: `amount` of device `index` (0-based, as CUDA_VISIBLE_DEVICES
// counts on that node). Fractional GPU requests (< 1) take one slice of one device; whole
// requests take whole devices. Requests above 1 must be whole numbers.
struct GpuShare {
  int index = 0;
  Quantity amount;
  bool operator==(const GpuShare&) const = default;
};

// A read-only snapshot of one node.
struct NodeView {
  NodeId id = 0;
  NodeState state = NodeState::kAlive;
  Resources total;
  Resources available;           // total minus bundle reservations minus actors outside groups
  Labels labels;
  std::vector<Quantity> gpu_free;  // free amount per device index
};

}  // namespace troupe::placement
