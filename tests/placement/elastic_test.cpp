#include <doctest/doctest.h>

#include "troupe/placement/elastic.hpp"

using namespace troupe::placement;

TEST_CASE("the elastic controller starts what a group lacks, stops what it has over its target") {
  CHECK(elastic_delta(ElasticDemand{1, 4, 1, 0}) == 3);
  CHECK(elastic_delta(ElasticDemand{1, 4, 1, 3}) == 0);   // three already waiting for room
  CHECK(elastic_delta(ElasticDemand{1, 2, 3, 1}) == -2);
}

TEST_CASE("freed room goes to the group furthest below its target first (the deficit rule)") {
  // Job A's group has 1 of 4, job B's 3 of 4: A first; B's tie with C (deficit 1) by its larger target.
  auto order = elastic_grow_order({{10, 4, 3, 1}, {20, 4, 1, 3}, {30, 2, 1, 1}, {40, 2, 2, 0}});
  CHECK(order == std::vector<std::uint64_t>{20, 10, 30});   // 40 is at its target
  CHECK(elastic_grow_order({{2, 3, 1, 0}, {1, 3, 1, 0}}) == std::vector<std::uint64_t>{1, 2});
  CHECK(elastic_grow_order({}).empty());
}
