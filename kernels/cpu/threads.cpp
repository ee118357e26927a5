// The CPU twins' thread budget.
#include <algorithm>
#include <atomic>
#include <thread>

#include "troupe/kernels/types.hpp"

namespace troupe::kernels {
namespace {

std::atomic<int>& thread_budget() {
  static std::atomic<int> n{std::max(1, int(std::thread::hardware_concurrency()))};
  return n;
}

}  // namespace

void set_num_threads(int n) { thread_budget().store(std::max(1, n)); }
int num_threads() { return thread_budget().load(std::memory_order_relaxed); }

}  // namespace troupe::kernels
