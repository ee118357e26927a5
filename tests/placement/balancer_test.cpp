#include <algorithm>
#include <numeric>
#include <random>

#include "placement_test_util.hpp"
#include "troupe/placement/balancer.hpp"

using namespace troupe::placement;

namespace {

// The least makespan over all k^n assignments.
std::int64_t brute_force_makespan(const std::vector<std::int64_t>& costs, std::size_t k) {
  std::vector<std::size_t> assign(costs.size(), 0);
  std::int64_t best = INT64_MAX;
  while (true) {
    std::vector<std::int64_t> loads(k, 0);
    for (std::size_t i = 0; i < costs.size(); ++i) loads[assign[i]] += costs[i];
    best = std::min(best, *std::max_element(loads.begin(), loads.end()));
    std::size_t i = 0;
    while (i < costs.size() && ++assign[i] == k) assign[i++] = 0;
    if (i == costs.size()) return best;
  }
}

// Every item in exactly one member; loads are the sums of their items.
void check_is_partition(const Partition& p, const std::vector<std::int64_t>& costs, std::size_t k) {
  REQUIRE(p.members.size() == k);
  std::vector<int> seen(costs.size(), 0);
  for (std::size_t m = 0; m < k; ++m) {
    std::int64_t load = 0;
    for (std::size_t i : p.members[m]) ++seen[i], load += costs[i];
    CHECK(load == p.loads[m]);
  }
  CHECK(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; }));
}

std::vector<std::int64_t> random_costs(std::mt19937_64& rng, std::size_t n, std::int64_t max) {
  std::vector<std::int64_t> out(n);
  for (auto& c : out) c = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(max + 1));
  return out;
}

}  // namespace

TEST_CASE("the optimal balancer equals brute force on small cases") {
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 600; ++trial) {
    const std::size_t k = 2 + trial % 3;
    const std::size_t n = 1 + rng() % (k == 4 ? 7 : 9);
    const auto costs = random_costs(rng, n, trial % 2 ? 20 : 1000);
    const Partition p = partition_optimal(costs, k);
    check_is_partition(p, costs, k);
    CHECK(p.makespan() == brute_force_makespan(costs, k));
  }
}

TEST_CASE("KK and LPT stay within Graham's 4/3 - 1/(3k) bound of brute force") {
  std::mt19937_64 rng(6);
  for (int trial = 0; trial < 600; ++trial) {
    const std::size_t k = 2 + trial % 3;
    const std::size_t n = 1 + rng() % (k == 4 ? 7 : 9);
    const auto costs = random_costs(rng, n, 100);
    const double optimum = static_cast<double>(brute_force_makespan(costs, k));
    const double bound = 4.0 / 3.0 - 1.0 / (3.0 * static_cast<double>(k));
    for (const Partition& p : {partition_kk(costs, k), partition_lpt(costs, k)}) {
      check_is_partition(p, costs, k);
      CHECK(static_cast<double>(p.makespan()) <= bound * optimum + 1e-9);
    }
  }
}

TEST_CASE("two-way KK is optimal for up to four items and misses on the classic five") {
  std::mt19937_64 rng(9);
  for (int trial = 0; trial < 500; ++trial) {
    const auto costs = random_costs(rng, 1 + rng() % 4, 50);
    CHECK(partition_kk(costs, 2).makespan() == brute_force_makespan(costs, 2));
  }
  const std::vector<std::int64_t> classic{8, 7, 6, 5, 4};  // Korf's example: KK 16, optimum 15
  CHECK(partition_kk(classic, 2).makespan() == 16);
  CHECK(partition_optimal(classic, 2).makespan() == 15);
}

TEST_CASE("KK balances lognormal token lengths to within 2% of the lower bound where round robin does not") {
  std::mt19937_64 rng(17);
  std::lognormal_distribution<double> tokens(std::log(512.0), 1.0);
  std::vector<std::int64_t> costs(4096);
  for (auto& c : costs) c = std::max<std::int64_t>(1, std::llround(tokens(rng)));
  const double lb = makespan_lower_bound(costs, 16);
  const Partition kk = partition_kk(costs, 16);
  check_is_partition(kk, costs, 16);
  CHECK(static_cast<double>(kk.makespan()) / lb <= 1.02);
  CHECK(static_cast<double>(partition_lpt(costs, 16).makespan()) / lb <= 1.05);
  CHECK(static_cast<double>(partition_round_robin(costs, 16).makespan()) / lb > 1.05);
}

TEST_CASE("degenerate inputs: no items, fewer items than members, k of zero") {
  const std::vector<std::int64_t> none;
  CHECK(partition_kk(none, 3).loads == std::vector<std::int64_t>{0, 0, 0});
  CHECK(partition_kk(none, 0).members.empty());
  const std::vector<std::int64_t> two{5, 9};
  for (auto method : {BalanceMethod::kKarmarkarKarp, BalanceMethod::kLpt, BalanceMethod::kOptimal})
    CHECK(partition(two, 4, method).makespan() == 9);  // each item alone
  CHECK(makespan_lower_bound(two, 4) == 9.0);
  CHECK(makespan_lower_bound(two, 1) == 14.0);
}
