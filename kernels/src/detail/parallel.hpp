#pragma once
// A small fork-join parallel-for for the CPU twins: the caller's thread takes the first slice and
// std::threads the rest; calls whose work is below kMinWorkPerThread stay on the caller.
// Threads are spawned per call (tens of microseconds), which is noise next to the >= 100 us of
// work a call must carry before it forks; where no thread can be started (a pids limit), the
// caller's thread runs the slices it could not hand out. Exceptions must not escape `fn`.

#include <algorithm>
#include <cstdint>
#include <system_error>
#include <thread>
#include <vector>

#include "troupe/kernels/types.hpp"

namespace troupe::kernels::detail {

inline constexpr std::int64_t kMinWorkPerThread = 1 << 18;  // ~bytes touched; ~50-100 us

// Calls fn(begin, end) on disjoint slices covering [0, n). `work_per_item` (e.g. bytes per row)
// decides how many threads pay off.
template <typename Fn>
void parallel_for(std::int64_t n, std::int64_t work_per_item, Fn&& fn) {
  if (n <= 0) return;
  const std::int64_t work = n * std::max<std::int64_t>(work_per_item, 1);
  std::int64_t threads = std::min<std::int64_t>(num_threads(), n);
  threads = std::min<std::int64_t>(threads, std::max<std::int64_t>(work / kMinWorkPerThread, 1));
  if (threads <= 1) {
    fn(std::int64_t{0}, n);
    return;
  }
  auto slice = [&](std::int64_t i) { return n * i / threads; };
  std::vector<std::thread> helpers;
  helpers.reserve(std::size_t(threads - 1));
  std::int64_t started = 1;   // slices handed to helpers: [1, started)
  try {
    for (; started < threads; ++started) helpers.emplace_back([&fn, b = slice(started), e = slice(started + 1)] { fn(b, e); });
  } catch (const std::system_error&) {   // no thread to be had (a pids limit): the rest here, not an abort
  }
  fn(slice(0), slice(1));
  if (started < threads) fn(slice(started), n);
  for (auto& t : helpers) t.join();
}

}  // namespace troupe::kernels::detail
