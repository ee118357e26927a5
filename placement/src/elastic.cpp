#include "troupe/placement/elastic.hpp"

#include <algorithm>

namespace troupe::placement {

std::int64_t elastic_delta(const ElasticDemand& d) { return d.target - (d.live + d.starting); }

std::vector<std::uint64_t> elastic_grow_order(std::vector<ElasticDemand> demands) {
  std::erase_if(demands, [](const ElasticDemand& d) { return d.live >= d.target; });
  std::sort(demands.begin(), demands.end(), [](const ElasticDemand& a, const ElasticDemand& b) {
    const auto da = a.target - a.live, db = b.target - b.live;
    if (da != db) return da > db;
    if (a.target != b.target) return a.target > b.target;
    return a.group < b.group;
  });
  std::vector<std::uint64_t> out;
  out.reserve(demands.size());
  for (const auto& d : demands) out.push_back(d.group);
  return out;
}

}  // namespace troupe::placement
