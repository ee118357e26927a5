#include "troupe/tensor.hpp"

#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>

namespace troupe {

std::size_t dtype_size(DType d) {
  switch (d) {
    case DType::F64: case DType::I64: return 8;
    case DType::F32: case DType::I32: return 4;
    case DType::F16: case DType::BF16: case DType::I16: return 2;
    case DType::I8: case DType::U8: case DType::Bool: return 1;
  }
  throw std::invalid_argument("unknown dtype");
}

std::string_view dtype_name(DType d) {
  static constexpr std::string_view kNames[] = {"f32", "f64", "f16", "bf16", "i64", "i32", "i16", "i8", "u8", "bool"};
  auto i = static_cast<std::size_t>(d);
  return i < std::size(kNames) ? kNames[i] : "?";
}

bool dtype_valid(std::uint8_t raw) { return raw <= static_cast<std::uint8_t>(DType::Bool); }

std::int64_t TensorView::numel() const {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

std::size_t TensorView::nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype); }

std::vector<std::int64_t> TensorView::contiguous_strides() const {
  std::vector<std::int64_t> s(shape.size());
  std::int64_t acc = 1;
  for (std::size_t i = shape.size(); i-- > 0;) { s[i] = acc; acc *= shape[i]; }
  return s;
}

bool TensorView::is_contiguous() const { return strides.empty() || strides == contiguous_strides(); }

TensorView TensorView::uninitialized(DType dtype, std::vector<std::int64_t> shape) {
  TensorView t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  for (auto d : t.shape) if (d < 0) throw std::invalid_argument("negative dimension");
  std::size_t n = t.nbytes();
  // 64-byte aligned so kernels and transports can use it directly.
  void* p = std::aligned_alloc(64, ((n + 63) / 64) * 64 + 64);
  if (p == nullptr) throw std::bad_alloc();
  t.data = p;
  t.keep_alive = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  return t;
}

TensorView TensorView::empty(DType dtype, std::vector<std::int64_t> shape) {
  TensorView t = uninitialized(dtype, std::move(shape));
  std::memset(t.data, 0, t.nbytes());
  return t;
}

TensorView TensorView::wrap(void* data, DType dtype, std::vector<std::int64_t> shape,
                            std::shared_ptr<void> owner, std::vector<std::int64_t> strides) {
  TensorView t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.strides = std::move(strides);
  t.data = data;
  t.keep_alive = std::move(owner);
  return t;
}

}  // namespace troupe
