#include "troupe/actors/tensor_bridge.hpp"

#include <ATen/ATen.h>

#include <stdexcept>
#include <string>

namespace troupe::actors {
namespace {

DType to_dtype(at::ScalarType s) {
  switch (s) {
    case at::kFloat: return DType::F32;
    case at::kDouble: return DType::F64;
    case at::kHalf: return DType::F16;
    case at::kBFloat16: return DType::BF16;
    case at::kLong: return DType::I64;
    case at::kInt: return DType::I32;
    case at::kShort: return DType::I16;
    case at::kChar: return DType::I8;
    case at::kByte: return DType::U8;
    case at::kBool: return DType::Bool;
    default: throw std::invalid_argument(std::string("tensor dtype has no troupe equivalent: ") + c10::toString(s));
  }
}

at::ScalarType to_scalar_type(DType d) {
  switch (d) {
    case DType::F32: return at::kFloat;
    case DType::F64: return at::kDouble;
    case DType::F16: return at::kHalf;
    case DType::BF16: return at::kBFloat16;
    case DType::I64: return at::kLong;
    case DType::I32: return at::kInt;
    case DType::I16: return at::kShort;
    case DType::I8: return at::kChar;
    case DType::U8: return at::kByte;
    case DType::Bool: return at::kBool;
  }
  throw std::invalid_argument("unknown troupe dtype");
}

}  // namespace

TensorView to_view(const at::Tensor& t) {
  if (!t.defined()) return TensorView{};
  if (!t.device().is_cpu()) throw std::invalid_argument("to_view: only CPU tensors are supported");
  at::Tensor held = t.detach();
  auto owner = std::shared_ptr<void>(new at::Tensor(held), [](void* p) { delete static_cast<at::Tensor*>(p); });
  std::vector<std::int64_t> shape(held.sizes().begin(), held.sizes().end());
  std::vector<std::int64_t> strides;
  if (!held.is_contiguous()) strides.assign(held.strides().begin(), held.strides().end());
  return TensorView::wrap(held.data_ptr(), to_dtype(held.scalar_type()), std::move(shape), std::move(owner),
                          std::move(strides));
}

at::Tensor from_view(const TensorView& v) {
  auto opts = at::TensorOptions().dtype(to_scalar_type(v.dtype));
  if (v.data == nullptr) {
    if (v.numel() != 0) throw std::invalid_argument("from_view: a view with elements but no data");
    return at::empty(v.shape, opts);
  }
  auto owner = v.keep_alive;
  auto deleter = [owner](void*) mutable { owner.reset(); };
  auto strides = v.strides.empty() ? v.contiguous_strides() : v.strides;
  return at::from_blob(v.data, v.shape, strides, deleter, opts);
}

TensorView to_owned_view(const at::Tensor& t) { return to_view(t.detach().clone(at::MemoryFormat::Contiguous)); }

}  // namespace troupe::actors
