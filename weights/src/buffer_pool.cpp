#include "buffer_pool.hpp"

#include "troupe/transport/data_plane.hpp"

namespace troupe::detail::weights {

TensorView BufferPool::get(std::size_t bytes) {
  TensorView buf;
  {
    std::lock_guard lock(mu_);
    if (auto it = idle_.find(bytes); it != idle_.end()) {
      buf = std::move(it->second);
      idle_.erase(it);
    }
  }
  if (buf.data == nullptr) {
    buf = transport::DataPlane::instance().allocate(DType::U8, {std::int64_t(bytes)});
    std::lock_guard lock(mu_);
    ++allocated_;
  }
  // The handed-out view owns a token whose deleter gives the real buffer back.
  std::weak_ptr<BufferPool> self = weak_from_this();
  auto* raw = new TensorView(std::move(buf));
  std::shared_ptr<void> token(raw->data, [self, raw](void*) {
    std::unique_ptr<TensorView> owned(raw);
    if (auto pool = self.lock()) pool->put(std::move(*owned));
  });
  return TensorView::wrap(raw->data, DType::U8, {std::int64_t(bytes)}, std::move(token));
}

void BufferPool::put(TensorView buffer) {
  TensorView evicted;   // unmapped after the lock is released
  std::lock_guard lock(mu_);
  if (max_idle_ == 0) return;
  if (idle_.size() >= max_idle_) {   // drop the smallest
    evicted = std::move(idle_.begin()->second);
    idle_.erase(idle_.begin());
  }
  idle_.emplace(buffer.nbytes(), std::move(buffer));
}

std::size_t BufferPool::allocated() const {
  std::lock_guard lock(mu_);
  return allocated_;
}

std::size_t BufferPool::idle() const {
  std::lock_guard lock(mu_);
  return idle_.size();
}

}  // namespace troupe::detail::weights
