#include "troupe/placement/elastic.hpp"

#include <algorithm>
#include <queue>
#include <tuple>

namespace troupe::placement {

std::int64_t elastic_delta(const ElasticDemand& d) { return d.target - (d.live + d.starting); }

namespace {

// The deficit rule's order: furthest below its target (by live members) first, then the larger
// target, then the lower id.
bool serves_first(const ElasticDemand& a, const ElasticDemand& b) {
  const auto da = a.target - a.live, db = b.target - b.live;
  if (da != db) return da > db;
  if (a.target != b.target) return a.target > b.target;
  return a.group < b.group;
}

}  // namespace

std::vector<std::uint64_t> elastic_grow_order(std::vector<ElasticDemand> demands) {
  std::erase_if(demands, [](const ElasticDemand& d) { return d.live >= d.target; });
  std::sort(demands.begin(), demands.end(), serves_first);
  std::vector<std::uint64_t> out;
  out.reserve(demands.size());
  for (const auto& d : demands) out.push_back(d.group);
  return out;
}

std::size_t elastic_fill(std::vector<ElasticDemand>& demands, const std::function<bool(const ElasticDemand&)>& place_one) {
  // A heap of indices into demands, the group to serve first on top.
  auto later = [&](std::size_t a, std::size_t b) { return serves_first(demands[b], demands[a]); };
  std::priority_queue<std::size_t, std::vector<std::size_t>, decltype(later)> next(later);
  for (std::size_t i = 0; i < demands.size(); ++i) {
    if (demands[i].live < demands[i].target) next.push(i);
  }
  std::size_t placed = 0;
  while (!next.empty()) {
    const std::size_t i = next.top();
    next.pop();
    ElasticDemand& d = demands[i];
    if (!place_one(d)) continue;   // no room for this group's shape now: out of this fill
    ++placed;
    ++d.live;
    if (d.starting > 0) --d.starting;
    if (d.live < d.target) next.push(i);
  }
  return placed;
}

}  // namespace troupe::placement
