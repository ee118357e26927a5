// Whole-buffer reads and writes on a pipe between a test (or benchmark) and the helper process it
// forked: read_exact gives up at `deadline`, write_exact throws when the peer has gone.
#pragma once

#include <poll.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <stdexcept>

namespace test_support {

inline bool read_exact(int fd, void* p, std::size_t n, std::chrono::steady_clock::time_point deadline) {
  for (auto* c = static_cast<char*>(p); n > 0;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
    pollfd pf{fd, POLLIN, 0};
    if (left <= 0 || ::poll(&pf, 1, int(left)) <= 0) return false;
    ssize_t k = ::read(fd, c, n);
    if (k <= 0) return false;
    c += k;
    n -= std::size_t(k);
  }
  return true;
}

inline void write_exact(int fd, const void* p, std::size_t n) {
  for (auto* c = static_cast<const char*>(p); n > 0;) {
    ssize_t k = ::write(fd, c, n);
    if (k <= 0) throw std::runtime_error("pipe to peer closed");
    c += k;
    n -= std::size_t(k);
  }
}

}  // namespace test_support
