// Shared by the actor-call benchmarks: the call patterns of Ray's microbenchmark, each run for
// a fixed wall time and reported as operations per second, with the CPU time this process spent
// per operation (getrusage: user + system, every thread): rates on this VM swing 2-3x with how
// idle it is, CPU per call much less.
#pragma once

#include <sys/resource.h>

#include <chrono>
#include <functional>

namespace bench {

inline constexpr int kBatch = 1000;         // calls in flight per async batch (as Ray's)
inline constexpr int kMembers = 8;          // n for 1:n and n:n
inline constexpr int kCallers = 2;          // caller threads for n:n (one per core)

struct Rate {
  double per_s = 0;    // operations per second of wall time
  double cpu_us = 0;   // this process's CPU microseconds per operation
};

inline double cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  auto s = [](const timeval& t) { return double(t.tv_sec) + double(t.tv_usec) * 1e-6; };
  return s(u.ru_utime) + s(u.ru_stime);
}

// Runs `round` (which performs `ops_per_round` operations) until `seconds` pass.
inline Rate measure(double seconds, long ops_per_round, const std::function<void()>& round) {
  using clock = std::chrono::steady_clock;
  round();   // warm-up
  long ops = 0;
  const double cpu0 = cpu_seconds();
  auto t0 = clock::now();
  auto deadline = t0 + std::chrono::duration<double>(seconds);
  while (clock::now() < deadline) { round(); ops += ops_per_round; }
  const double wall = std::chrono::duration<double>(clock::now() - t0).count();
  return Rate{double(ops) / wall, (cpu_seconds() - cpu0) * 1e6 / double(ops)};
}

inline double rate(double seconds, long ops_per_round, const std::function<void()>& round) {
  return measure(seconds, ops_per_round, round).per_s;
}

}  // namespace bench
