#include "troupe/placement/balancer.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <queue>
#include <tuple>

namespace troupe::placement {
namespace {

// One subset of a KK tuple: its load and a linked list of items (next_item threads them).
struct Subset {
  std::int64_t load = 0;
  int head = -1;
  int tail = -1;
};
using Tuple = std::vector<Subset>;  // sorted by load, descending

std::int64_t spread(const Tuple& t) { return t.front().load - t.back().load; }

Partition from_assignment(std::span<const std::int64_t> costs, const std::vector<std::size_t>& member_of, std::size_t k) {
  Partition p;
  p.members.resize(k);
  p.loads.assign(k, 0);
  for (std::size_t i = 0; i < costs.size(); ++i) {
    p.members[member_of[i]].push_back(i);
    p.loads[member_of[i]] += costs[i];
  }
  return p;
}

// Depth-first search state for partition_optimal.
struct Search {
  std::span<const std::int64_t> costs;
  std::vector<std::size_t> order;  // item indices, decreasing cost
  std::vector<std::int64_t> loads;
  std::vector<std::size_t> member_of, best_member_of;
  std::int64_t best = 0;
  std::int64_t floor = 0;  // ceil of the lower bound: stop on reaching it

  void run(std::size_t depth, std::int64_t current) {
    if (best <= floor) return;
    if (depth == order.size()) {
      best = current;
      best_member_of = member_of;
      return;
    }
    const std::size_t item = order[depth];
    for (std::size_t m = 0; m < loads.size(); ++m) {
      // Members with equal loads are interchangeable: try only the first of them.
      if (std::find(loads.begin(), loads.begin() + m, loads[m]) != loads.begin() + m) continue;
      const std::int64_t next = loads[m] + costs[item];
      if (next >= best) continue;
      loads[m] = next;
      member_of[item] = m;
      run(depth + 1, std::max(current, next));
      loads[m] -= costs[item];
    }
  }
};

}  // namespace

std::int64_t Partition::makespan() const { return loads.empty() ? 0 : *std::max_element(loads.begin(), loads.end()); }

double makespan_lower_bound(std::span<const std::int64_t> costs, std::size_t k) {
  if (costs.empty() || k == 0) return 0;
  const double sum = static_cast<double>(std::accumulate(costs.begin(), costs.end(), std::int64_t{0}));
  return std::max(sum / static_cast<double>(k), static_cast<double>(*std::max_element(costs.begin(), costs.end())));
}

Partition partition_kk(std::span<const std::int64_t> costs, std::size_t k) {
  if (k == 0) return {};
  if (costs.empty()) return from_assignment(costs, {}, k);
  std::vector<int> next_item(costs.size(), -1);
  std::vector<Tuple> tuples(costs.size(), Tuple(k));
  using Entry = std::tuple<std::int64_t, int, std::size_t>;  // spread, -index (older first), tuple
  std::priority_queue<Entry> heap;
  for (std::size_t i = 0; i < costs.size(); ++i) {
    tuples[i][0] = {costs[i], static_cast<int>(i), static_cast<int>(i)};
    heap.emplace(costs[i], -static_cast<int>(i), i);
  }
  while (heap.size() > 1) {
    const std::size_t a = std::get<2>(heap.top());
    heap.pop();
    const std::size_t b = std::get<2>(heap.top());
    heap.pop();
    Tuple& ta = tuples[a];
    Tuple& tb = tuples[b];
    for (std::size_t j = 0; j < k; ++j) {  // heaviest of a with lightest of b
      Subset& x = ta[j];
      const Subset& y = tb[k - 1 - j];
      if (y.head < 0) continue;
      if (x.head < 0) x.head = y.head;
      else next_item[x.tail] = y.head;
      x.tail = y.tail;
      x.load += y.load;
    }
    std::stable_sort(ta.begin(), ta.end(), [](const Subset& x, const Subset& y) { return x.load > y.load; });
    tb.clear();
    tb.shrink_to_fit();
    heap.emplace(spread(ta), -static_cast<int>(a), a);
  }
  const Tuple& last = tuples[std::get<2>(heap.top())];
  std::vector<std::size_t> member_of(costs.size());
  for (std::size_t m = 0; m < k; ++m)
    for (int i = last[m].head; i >= 0; i = next_item[i]) member_of[i] = m;
  return from_assignment(costs, member_of, k);
}

Partition partition_lpt(std::span<const std::int64_t> costs, std::size_t k) {
  if (k == 0) return {};
  std::vector<std::size_t> order(costs.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) { return costs[x] > costs[y]; });
  using Entry = std::pair<std::int64_t, std::size_t>;  // load, member
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> least;
  for (std::size_t m = 0; m < k; ++m) least.emplace(0, m);
  std::vector<std::size_t> member_of(costs.size());
  for (std::size_t i : order) {
    auto [load, m] = least.top();
    least.pop();
    member_of[i] = m;
    least.emplace(load + costs[i], m);
  }
  return from_assignment(costs, member_of, k);
}

Partition partition_round_robin(std::span<const std::int64_t> costs, std::size_t k) {
  if (k == 0) return {};
  std::vector<std::size_t> member_of(costs.size());
  for (std::size_t i = 0; i < costs.size(); ++i) member_of[i] = i % k;
  return from_assignment(costs, member_of, k);
}

Partition partition_optimal(std::span<const std::int64_t> costs, std::size_t k) {
  if (k == 0) return {};
  Partition seed = partition_kk(costs, k);
  if (Partition lpt = partition_lpt(costs, k); lpt.makespan() < seed.makespan()) seed = std::move(lpt);
  Search s{costs, {}, std::vector<std::int64_t>(k, 0), std::vector<std::size_t>(costs.size()), {}, 0, 0};
  s.best = seed.makespan() + 1;  // strictly better than this; seed is kept if nothing beats it
  s.floor = static_cast<std::int64_t>(std::ceil(makespan_lower_bound(costs, k) - 1e-9));
  s.order.resize(costs.size());
  std::iota(s.order.begin(), s.order.end(), 0);
  std::stable_sort(s.order.begin(), s.order.end(), [&](std::size_t x, std::size_t y) { return costs[x] > costs[y]; });
  s.run(0, 0);
  if (s.best_member_of.empty()) return seed;
  return from_assignment(costs, s.best_member_of, k);
}

Partition partition(std::span<const std::int64_t> costs, std::size_t k, BalanceMethod method) {
  switch (method) {
    case BalanceMethod::kKarmarkarKarp: return partition_kk(costs, k);
    case BalanceMethod::kLpt: return partition_lpt(costs, k);
    case BalanceMethod::kRoundRobin: return partition_round_robin(costs, k);
    case BalanceMethod::kOptimal: return partition_optimal(costs, k);
  }
  return {};
}

}  // namespace troupe::placement
