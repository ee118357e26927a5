// Reusable shared-memory buffers for weight versions. Every buffer is a DataPlane::allocate()
// region, so a version (or a relay's received copy) is exposed to other processes with no copy;
// a buffer whose last view is dropped comes back here and the next version of the same size
// reuses it: repeated publishes/pulls of one model cost no allocation, registration or page
// faults. Thread-safe; the pool may die before its buffers (they are then simply freed).
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>

#include "troupe/tensor.hpp"

namespace troupe::detail::weights {

class BufferPool : public std::enable_shared_from_this<BufferPool> {
 public:
  explicit BufferPool(std::size_t max_idle) : max_idle_(max_idle) {}

  // A U8 [bytes] view (contents unspecified). Its keep_alive returns the buffer here once every
  // copy of it (WeightSets, exposed regions) is gone — that is the WS-2 freeing point.
  // Throws TransportError(Ucx) / std::bad_alloc.
  TensorView get(std::size_t bytes);
  std::size_t allocated() const;   // buffers ever allocated by this pool
  std::size_t idle() const;

 private:
  void put(TensorView buffer);

  std::size_t max_idle_;
  mutable std::mutex mu_;
  std::multimap<std::size_t, TensorView> idle_;   // by size
  std::size_t allocated_ = 0;
};

}  // namespace troupe::detail::weights
