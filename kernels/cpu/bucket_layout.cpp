// Bucket layout planning (host code shared by the CPU twin and the CUDA entry points).
#include <unordered_set>

#include "troupe/kernels/bucket.hpp"

namespace troupe::kernels {
namespace {

std::size_t align_up(std::size_t x, std::size_t a) { return (x + a - 1) / a * a; }

}  // namespace

const BucketEntry* BucketLayout::find(std::string_view name) const {
  for (const BucketEntry& e : entries) {
    if (e.spec.name == name) return &e;
  }
  return nullptr;
}

Status plan_bucket(std::span<const TensorSpec> specs, BucketLayout* layout) {
  if (!layout) return {KernelCode::BadArguments, "plan_bucket: null layout"};
  BucketLayout out;
  std::unordered_set<std::string_view> names;
  std::size_t offset = 0;
  for (const TensorSpec& s : specs) {
    if (s.name.empty() || !names.insert(s.name).second) {
      return {KernelCode::BadArguments, "plan_bucket: empty or repeated name '" + s.name + "'"};
    }
    if (s.dtype != DType::kF32 && s.dtype != DType::kBF16) {
      return {KernelCode::BadArguments, "plan_bucket: unknown dtype for " + s.name};
    }
    if (s.rows < 0 || s.cols < 0) {
      return {KernelCode::BadArguments, "plan_bucket: negative size for " + s.name};
    }
    BucketEntry e{s, offset, 0, 0};
    const std::size_t n = std::size_t(s.numel());
    switch (s.wire) {
      case WireFormat::kF32: e.bytes = 4 * n; break;
      case WireFormat::kBF16: e.bytes = 2 * n; break;
      case WireFormat::kInt8Row:
        e.data_offset = align_up(4 * std::size_t(s.rows), 16);
        e.bytes = e.data_offset + n;
        break;
      default: return {KernelCode::BadArguments, "plan_bucket: unknown wire format"};
    }
    offset = align_up(offset + e.bytes, kBucketAlign);
    out.entries.push_back(std::move(e));
  }
  out.bytes = offset;
  *layout = std::move(out);
  return {};
}

}  // namespace troupe::kernels
