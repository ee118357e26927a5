// The elastic controller's decisions, as pure functions: the head calls them on its elastic
// groups, and the simulator and tests call the same code. A group wants `target` members; it has
// `live` ones running and `starting` ones placed or waiting for room.
#pragma once

#include <cstdint>
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

}  // namespace troupe::placement
