#pragma once
// Bucket work split shared by the CPU twin and the CUDA launch: entries cut into tasks of whole
// rows (kInt8Row needs a row per scale) holding about kTaskElems elements each.

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "troupe/kernels/bucket.hpp"

namespace troupe::kernels::detail {

inline constexpr std::int64_t kTaskElems = 1 << 16;

struct BucketTask {
  std::int32_t entry;
  std::int64_t row_begin;
  std::int64_t row_end;
};

inline std::vector<BucketTask> bucket_tasks(const BucketLayout& layout) {
  std::vector<BucketTask> tasks;
  for (std::size_t e = 0; e < layout.entries.size(); ++e) {
    const TensorSpec& s = layout.entries[e].spec;
    if (s.numel() == 0) continue;
    const std::int64_t step = std::max<std::int64_t>(1, kTaskElems / std::max<std::int64_t>(s.cols, 1));
    for (std::int64_t r = 0; r < s.rows; r += step) {
      tasks.push_back({std::int32_t(e), r, std::min(s.rows, r + step)});
    }
  }
  return tasks;
}

inline Status check_bucket_io(const BucketLayout& layout, std::size_t n_tensors, const void* bucket,
                              std::span<const void* const> tensors) {
  if (n_tensors != layout.entries.size()) {
    return {KernelCode::BadArguments, "bucket: " + std::to_string(n_tensors) + " tensors for " +
                                          std::to_string(layout.entries.size()) + " entries"};
  }
  if (layout.bytes > 0 && !bucket) return {KernelCode::BadArguments, "bucket: null bucket"};
  for (std::size_t i = 0; i < n_tensors; ++i) {
    if (layout.entries[i].spec.numel() > 0 && !tensors[i]) {
      return {KernelCode::BadArguments, "bucket: null tensor for " + layout.entries[i].spec.name};
    }
  }
  return {};
}

}  // namespace troupe::kernels::detail
