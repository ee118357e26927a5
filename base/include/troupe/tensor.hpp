// The runtime's tensor: a plain view over bytes (dtype, shape, strides, data) plus a keep-alive
// handle that owns whatever backs the bytes. runtime/ never includes torch; actors/ wraps a
// torch::Tensor into a TensorView and back without copying.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

namespace troupe {

enum class DType : std::uint8_t { F32 = 0, F64, F16, BF16, I64, I32, I16, I8, U8, Bool };

std::size_t dtype_size(DType d);        // bytes per element
std::string_view dtype_name(DType d);   // "f32", "bf16", ...
bool dtype_valid(std::uint8_t raw);     // raw wire value names a DType

// A view of tensor memory. Copying a view shares the bytes (and the keep-alive), never copies
// them. Strides are in elements (as torch); empty strides mean contiguous.
struct TensorView {
  DType dtype = DType::F32;
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> strides;
  void* data = nullptr;
  std::shared_ptr<void> keep_alive;    // owner of `data`; may be null for borrowed memory

  std::int64_t numel() const;
  std::size_t nbytes() const;          // numel * dtype_size (the bytes a contiguous copy needs)
  bool is_contiguous() const;
  std::vector<std::int64_t> contiguous_strides() const;

  template <class T> T* data_as() const { return static_cast<T*>(data); }

  // A fresh, zero-initialised, contiguous tensor that owns its bytes (64-byte aligned).
  static TensorView empty(DType dtype, std::vector<std::int64_t> shape);
  // The same, its bytes not initialised: for a tensor its maker writes whole at once (a copy).
  static TensorView uninitialized(DType dtype, std::vector<std::int64_t> shape);
  // A view of `data` kept alive by `owner` (contiguous unless strides are given).
  static TensorView wrap(void* data, DType dtype, std::vector<std::int64_t> shape,
                         std::shared_ptr<void> owner, std::vector<std::int64_t> strides = {});
};

}  // namespace troupe
