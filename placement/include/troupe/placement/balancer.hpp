// Static balancing: split n items with costs (e.g. sequence token counts) into k members so
// that the largest member load (the makespan) is small. Used to split a batch across a group.
//
// All functions are pure, thread-safe, and deterministic (ties go to the lower index).
// Costs must be non-negative; k must be at least 1 (k == 0 yields an empty Partition).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace troupe::placement {

struct Partition {
  std::vector<std::vector<std::size_t>> members;  // item indices per member, each list ascending
  std::vector<std::int64_t> loads;                // sum of costs per member
  std::int64_t makespan() const;                  // the largest load (0 when empty)
};

enum class BalanceMethod {
  kKarmarkarKarp,  // largest differencing, k-way; O(n k log n); typically within 0.1% of optimal
  kLpt,            // longest processing time first; O(n log n); <= (4/3 - 1/(3k)) x optimal
  kRoundRobin,     // item i to member i mod k; the naive baseline
  kOptimal,        // exact branch and bound; exponential: small n only (tests, n <= ~24)
};

// Karmarkar–Karp largest differencing method, generalised to k members: every item starts
// as a k-tuple of subsets (itself and k-1 empty ones); the two tuples whose max-min spread is
// largest are merged, pairing the heaviest subset of one with the lightest of the other, until
// one tuple remains.
Partition partition_kk(std::span<const std::int64_t> costs, std::size_t k);
// Items sorted by decreasing cost, each to the member with the least load so far.
Partition partition_lpt(std::span<const std::int64_t> costs, std::size_t k);
Partition partition_round_robin(std::span<const std::int64_t> costs, std::size_t k);
// A partition with the least possible makespan (depth-first search over items in decreasing
// order, seeded with the better of KK and LPT, pruned by the lower bound and member symmetry).
Partition partition_optimal(std::span<const std::int64_t> costs, std::size_t k);

Partition partition(std::span<const std::int64_t> costs, std::size_t k, BalanceMethod method);

// max(sum / k, largest cost): no partition can do better. Returns 0 for no items.
double makespan_lower_bound(std::span<const std::int64_t> costs, std::size_t k);

}  // namespace troupe::placement
