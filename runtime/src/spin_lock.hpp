// A lock for critical sections of a few dozen instructions taken by two threads at high rate
// (a caller submitting, an actor completing). Spins briefly, then yields; never sleeps in the
// kernel, so an uncontended or briefly contended acquire costs no system call.
#pragma once

#include <atomic>
#include <thread>

namespace troupe::detail {

class SpinLock {
 public:
  void lock() noexcept {
    for (int spins = 0;; ++spins) {
      if (!locked_.exchange(true, std::memory_order_acquire)) return;
      while (locked_.load(std::memory_order_relaxed)) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
        if (++spins > 64) { std::this_thread::yield(); spins = 0; }
      }
    }
  }
  void unlock() noexcept { locked_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> locked_{false};
};

}  // namespace troupe::detail
