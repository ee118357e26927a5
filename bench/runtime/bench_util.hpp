// Shared by the actor-call benchmarks: the call patterns of Ray's microbenchmark, each run for
// a fixed wall time and reported as operations per second.
#pragma once

#include <chrono>
#include <functional>

namespace bench {

inline constexpr int kBatch = 1000;         // calls in flight per async batch (as Ray's)
inline constexpr int kMembers = 8;          // n for 1:n and n:n
inline constexpr int kCallers = 2;          // caller threads for n:n (one per core)

// Runs `round` (which performs `ops_per_round` operations) until `seconds` pass; returns ops/s.
inline double rate(double seconds, long ops_per_round, const std::function<void()>& round) {
  using clock = std::chrono::steady_clock;
  round();   // warm-up
  long ops = 0;
  auto t0 = clock::now();
  auto deadline = t0 + std::chrono::duration<double>(seconds);
  while (clock::now() < deadline) { round(); ops += ops_per_round; }
  return double(ops) / std::chrono::duration<double>(clock::now() - t0).count();
}

}  // namespace bench
