// CPU twin of kernel 5: per-row conversion loops (vectorised), tasks of whole rows over threads.
#include <cmath>
#include <cstring>

#include "detail/bucket_plan.hpp"
#include "detail/formulas.hpp"
#include "detail/parallel.hpp"
#include "detail/simd.hpp"
#include "troupe/kernels/bucket.hpp"

namespace troupe::kernels {
namespace {

[[gnu::always_inline]] inline float load(const float* p, std::int64_t i) { return p[i]; }
[[gnu::always_inline]] inline float load(const bf16* p, std::int64_t i) { return to_float(p[i]); }
[[gnu::always_inline]] inline void store(float* p, std::int64_t i, float v) { p[i] = v; }
[[gnu::always_inline]] inline void store(bf16* p, std::int64_t i, float v) { p[i] = to_bf16(v); }

template <typename Src, typename Dst>
[[gnu::always_inline]] inline void convert(const Src* src, Dst* dst, std::int64_t n) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) store(dst, i, load(src, i));
}

template <typename Src>
[[gnu::always_inline]] inline void quantise_row(const Src* src, std::int64_t n, float* scale,
                                                std::int8_t* q) {
  float amax = 0.0f;
#pragma omp simd reduction(max : amax)
  for (std::int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(load(src, i)));
  *scale = detail::int8_scale(amax);
  const float inv = detail::int8_inv_scale(amax);
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) q[i] = detail::int8_quantise(load(src, i), inv);
}

template <typename Dst>
[[gnu::always_inline]] inline void dequantise_row(const std::int8_t* q, float scale, std::int64_t n,
                                                  Dst* dst) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) store(dst, i, float(q[i]) * scale);
}

// Rows [r0, r1) of one entry, tensor -> bucket. `Src` is the tensor's element type.
template <typename Src>
[[gnu::always_inline]] inline void pack_rows(const BucketEntry& e, const Src* src, std::byte* out,
                                             std::int64_t r0, std::int64_t r1) {
  const std::int64_t c = e.spec.cols;
  const Src* s = src + r0 * c;
  std::byte* base = out + e.offset;
  switch (e.spec.wire) {
    case WireFormat::kF32: return convert(s, reinterpret_cast<float*>(base) + r0 * c, (r1 - r0) * c);
    case WireFormat::kBF16: return convert(s, reinterpret_cast<bf16*>(base) + r0 * c, (r1 - r0) * c);
    case WireFormat::kInt8Row: {
      auto* scales = reinterpret_cast<float*>(base);
      auto* q = reinterpret_cast<std::int8_t*>(base + e.data_offset);
      for (std::int64_t r = r0; r < r1; ++r) quantise_row(src + r * c, c, scales + r, q + r * c);
      return;
    }
  }
}

template <typename Dst>
[[gnu::always_inline]] inline void unpack_rows(const BucketEntry& e, const std::byte* in, Dst* dst,
                                               std::int64_t r0, std::int64_t r1) {
  const std::int64_t c = e.spec.cols;
  Dst* d = dst + r0 * c;
  const std::byte* base = in + e.offset;
  switch (e.spec.wire) {
    case WireFormat::kF32: return convert(reinterpret_cast<const float*>(base) + r0 * c, d, (r1 - r0) * c);
    case WireFormat::kBF16: return convert(reinterpret_cast<const bf16*>(base) + r0 * c, d, (r1 - r0) * c);
    case WireFormat::kInt8Row: {
      auto* scales = reinterpret_cast<const float*>(base);
      auto* q = reinterpret_cast<const std::int8_t*>(base + e.data_offset);
      for (std::int64_t r = r0; r < r1; ++r) dequantise_row(q + r * c, scales[r], c, dst + r * c);
      return;
    }
  }
}

TROUPE_SIMD_CLONES
void pack_task(const BucketEntry& e, const void* src, std::byte* out, std::int64_t r0, std::int64_t r1) {
  if (e.spec.dtype == DType::kF32) pack_rows(e, static_cast<const float*>(src), out, r0, r1);
  else pack_rows(e, static_cast<const bf16*>(src), out, r0, r1);
}

TROUPE_SIMD_CLONES
void unpack_task(const BucketEntry& e, const std::byte* in, void* dst, std::int64_t r0, std::int64_t r1) {
  if (e.spec.dtype == DType::kF32) unpack_rows(e, in, static_cast<float*>(dst), r0, r1);
  else unpack_rows(e, in, static_cast<bf16*>(dst), r0, r1);
}

// Zeroes the bytes no entry writes: the int8 scale padding and the gaps between entries.
void zero_padding(const BucketLayout& layout, std::byte* out) {
  std::size_t end = 0;
  for (const BucketEntry& e : layout.entries) {
    std::memset(out + end, 0, e.offset - end);
    if (e.spec.wire == WireFormat::kInt8Row) {
      const std::size_t scales = 4 * std::size_t(e.spec.rows);
      std::memset(out + e.offset + scales, 0, e.data_offset - scales);
    }
    end = e.offset + e.bytes;
  }
  std::memset(out + end, 0, layout.bytes - end);
}

}  // namespace

Status pack_bucket(const BucketLayout& layout, std::span<const void* const> tensors,
                   std::byte* bucket) {
  TROUPE_RETURN_IF_ERROR(detail::check_bucket_io(layout, tensors.size(), bucket, tensors));
  if (layout.bytes > 0) zero_padding(layout, bucket);
  const std::vector<detail::BucketTask> tasks = detail::bucket_tasks(layout);
  detail::parallel_for(std::int64_t(tasks.size()), detail::kTaskElems * 6, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i) {
      const detail::BucketTask& t = tasks[std::size_t(i)];
      pack_task(layout.entries[std::size_t(t.entry)], tensors[std::size_t(t.entry)], bucket, t.row_begin, t.row_end);
    }
  });
  return {};
}

Status unpack_bucket(const BucketLayout& layout, const std::byte* bucket,
                     std::span<void* const> tensors) {
  std::vector<const void*> views(tensors.begin(), tensors.end());
  TROUPE_RETURN_IF_ERROR(detail::check_bucket_io(layout, tensors.size(), bucket, views));
  const std::vector<detail::BucketTask> tasks = detail::bucket_tasks(layout);
  detail::parallel_for(std::int64_t(tasks.size()), detail::kTaskElems * 6, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i) {
      const detail::BucketTask& t = tasks[std::size_t(i)];
      unpack_task(layout.entries[std::size_t(t.entry)], bucket, tensors[std::size_t(t.entry)], t.row_begin, t.row_end);
    }
  });
  return {};
}

}  // namespace troupe::kernels
