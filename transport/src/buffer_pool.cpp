#include "buffer_pool.hpp"

#include <sys/mman.h>

#include <cstdlib>
#include <new>
#include <vector>

namespace troupe::transport {
namespace {

constexpr std::size_t kHugePage = 2 << 20;

std::size_t capacity_for(std::size_t n) {
  if (n < BufferPool::kMinPooled) return std::max<std::size_t>((n + 63) / 64 * 64, 64);
  return (n + kHugePage - 1) / kHugePage * kHugePage;
}

void* allocate(std::size_t capacity) {
  const bool big = capacity >= BufferPool::kMinPooled;
  void* p = std::aligned_alloc(big ? kHugePage : 64, capacity);
  if (p == nullptr) throw std::bad_alloc();
  // One batched fault pass instead of a fault per page (advice only). Transparent huge pages were
  // tried and dropped: with defrag=madvise a 1 GiB first touch could stall in compaction.
  if (big) ::madvise(p, capacity, MADV_POPULATE_WRITE);
  return p;
}

}  // namespace

std::shared_ptr<void> BufferPool::get(std::size_t n) {
  const std::size_t cap = capacity_for(n);
  if (cap < kMinPooled) return std::shared_ptr<void>(allocate(cap), [](void* q) { std::free(q); });
  void* p = nullptr;
  {
    std::lock_guard lock(mu_);
    if (auto it = idle_.find(cap); it != idle_.end()) {
      p = it->second.p;
      cached_ -= cap;
      idle_.erase(it);
    }
  }
  if (p == nullptr) p = allocate(cap);
  std::weak_ptr<BufferPool> pool = weak_from_this();
  return std::shared_ptr<void>(p, [pool, cap](void* q) {
    if (auto alive = pool.lock()) return alive->put(q, cap);
    std::free(q);
  });
}

void BufferPool::put(void* p, std::size_t capacity) {
  std::vector<void*> evict;
  {
    std::lock_guard lock(mu_);
    idle_.emplace(capacity, Idle{p, std::chrono::steady_clock::now()});
    cached_ += capacity;
    while (cached_ > kMaxCachedBytes) {   // drop the largest first: they cost the most to keep
      auto it = std::prev(idle_.end());
      cached_ -= it->first;
      evict.push_back(it->second.p);
      idle_.erase(it);
    }
  }
  for (void* q : evict) std::free(q);
}

void BufferPool::trim() {
  std::vector<void*> evict;
  {
    std::lock_guard lock(mu_);
    auto cutoff = std::chrono::steady_clock::now() - kMaxIdle;
    for (auto it = idle_.begin(); it != idle_.end();) {
      if (it->second.since > cutoff) { ++it; continue; }
      cached_ -= it->first;
      evict.push_back(it->second.p);
      it = idle_.erase(it);
    }
  }
  for (void* q : evict) std::free(q);
}

std::size_t BufferPool::cached_bytes() const {
  std::lock_guard lock(mu_);
  return cached_;
}

BufferPool::~BufferPool() {
  for (auto& [cap, idle] : idle_) std::free(idle.p);
}

}  // namespace troupe::transport
