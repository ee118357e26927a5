// The elastic controller's decisions, as pure functions: the head calls them on its elastic
// groups, and the simulator and tests call the same code. A group wants `target` members; it has
// `live` ones running and `starting` ones placed or waiting for room.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace troupe::placement {

struct ElasticDemand {
  std::uint64_t group = 0;
  std::int64_t target = 0;
  std::int64_t live = 0;
  std::int64_t starting = 0;
};

// Members to start (> 0) or to stop (< 0) so that live + starting meets the target.
std::int64_t elastic_delta(const ElasticDemand& d);

// The order in which groups get room that comes free: the group furthest below its target (by
// live members) first; ties by the larger target, then by group id. Groups at or above their
// target are left out.
std::vector<std::uint64_t> elastic_grow_order(std::vector<ElasticDemand> demands);

// Hands room out by the deficit rule, one member at a time: the group furthest below its target
// (elastic_grow_order's order, recomputed after every member) gets the next one, while
// `place_one(group's demand)` places one (true) for it; a group that cannot place one drops out of
// this fill (room only shrinks during it). `demands` follows: a placed member counts as live (a
// waiting one, starting > 0, moves from starting). Returns how many were placed. O(placed · log
// groups). The head calls it with a waiting member's placement, the simulator with a new one's.
std::size_t elastic_fill(std::vector<ElasticDemand>& demands, const std::function<bool(const ElasticDemand&)>& place_one);

}  // namespace troupe::placement
