// torch <-> troupe::TensorView without copying. The view keeps the tensor's storage alive; the
// tensor made from a view keeps the view's owner alive. Include only from torch-using sources.
#pragma once

#include <ATen/core/Tensor.h>

#include "troupe/tensor.hpp"

namespace troupe::actors {

// A view sharing `t`'s memory (any strides); holds a reference to `t` until the last copy of the
// view is gone. Throws std::invalid_argument for a dtype TensorView cannot name or a non-CPU tensor.
TensorView to_view(const at::Tensor& t);

// A CPU tensor sharing `v`'s memory; writes through it are visible to every holder of `v`.
// An empty view (no data, numel 0) gives an empty tensor. Throws std::invalid_argument.
at::Tensor from_view(const TensorView& v);

// A contiguous copy that owns its memory (for values that must outlive a mutable source).
TensorView to_owned_view(const at::Tensor& t);

}  // namespace troupe::actors
