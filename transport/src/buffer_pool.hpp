// Receive buffers for DataPlane::fetch. A fresh 1 GiB buffer costs ~260k page faults plus zeroing
// on first touch — as much as the transfer itself — so big buffers freed by their last
// TensorView come back here and the next fetch of a similar size reuses them.
#pragma once

#include <chrono>
#include <cstddef>
#include <map>
#include <memory>
#include <mutex>

namespace troupe::transport {

class BufferPool : public std::enable_shared_from_this<BufferPool> {
 public:
  static constexpr std::size_t kMinPooled = 1 << 20;        // smaller buffers are malloc'd
  static constexpr std::size_t kMaxCachedBytes = std::size_t(2) << 30;
  static constexpr auto kMaxIdle = std::chrono::seconds(10);

  // A 64-byte-aligned buffer of at least `n` bytes (2 MiB aligned and prefaulted when big;
  // contents unspecified). Its deleter returns it to this pool, or frees it
  // once the pool is gone. Thread-safe; throws std::bad_alloc.
  std::shared_ptr<void> get(std::size_t n);
  // Frees cached buffers idle for longer than kMaxIdle. Thread-safe.
  void trim();
  std::size_t cached_bytes() const;
  ~BufferPool();

 private:
  struct Idle {
    void* p;
    std::chrono::steady_clock::time_point since;
  };
  void put(void* p, std::size_t capacity);

  mutable std::mutex mu_;
  std::multimap<std::size_t, Idle> idle_;   // by capacity
  std::size_t cached_ = 0;
};

}  // namespace troupe::transport
