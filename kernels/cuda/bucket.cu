// Kernel 5 on the GPU: the whole bucket in one launch. The host cuts the layout into tasks (the
// CPU twin's split, plus zero-fill tasks for padding) and ships the table with the launch; block b
// runs task b. Conversions use the shared formulas, so bf16 and f32 buckets are byte-identical to
// the CPU's and int8 differs at most where x * 127 / amax sits on a rounding tie.
#include <vector>

#include "common.cuh"
#include "detail/bucket_plan.hpp"
#include "detail/formulas.hpp"
#include "troupe/kernels/cuda.hpp"

namespace troupe::kernels::cuda {
namespace {

namespace kd = ::troupe::kernels::detail;
constexpr int kThreads = 256;

struct Task {
  void* tensor;              // entry's tensor (const for pack); null for a zero-fill task
  std::byte* bucket;         // entry start in the bucket (or the bytes to zero)
  std::int64_t data_offset;  // kInt8Row: bytes from entry start to the int8 values
  std::int64_t cols;
  std::int64_t row_begin, row_end;  // zero-fill: bytes are [row_begin, row_end)
  DType dtype;
  WireFormat wire;
};

__device__ __forceinline__ float load(const void* p, DType t, std::int64_t i) {
  return t == DType::kF32 ? static_cast<const float*>(p)[i]
                          : __uint_as_float(std::uint32_t(static_cast<const bf16*>(p)[i].bits) << 16);
}

// Round to nearest even, NaN kept quiet: the device twin of kernels::to_bf16.
__device__ __forceinline__ bf16 to_bf16_device(float f) {
  std::uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{std::uint16_t((u >> 16) | 0x40u)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{std::uint16_t(u >> 16)};
}

__device__ __forceinline__ void store(void* p, DType t, std::int64_t i, float v) {
  if (t == DType::kF32) static_cast<float*>(p)[i] = v;
  else static_cast<bf16*>(p)[i] = to_bf16_device(v);
}

__global__ __launch_bounds__(kThreads) void pack_kernel(const Task* tasks) {
  const Task t = tasks[blockIdx.x];
  if (t.tensor == nullptr) {
    for (std::int64_t i = t.row_begin + threadIdx.x; i < t.row_end; i += kThreads) t.bucket[i] = std::byte{0};
    return;
  }
  if (t.wire != WireFormat::kInt8Row) {
    for (std::int64_t i = t.row_begin * t.cols + threadIdx.x; i < t.row_end * t.cols; i += kThreads) {
      store(t.bucket, t.wire == WireFormat::kF32 ? DType::kF32 : DType::kBF16, i, load(t.tensor, t.dtype, i));
    }
    return;
  }
  auto* scales = reinterpret_cast<float*>(t.bucket);
  auto* q = reinterpret_cast<std::int8_t*>(t.bucket + t.data_offset);
  for (std::int64_t r = t.row_begin; r < t.row_end; ++r) {
    float amax = 0.0f;
    for (std::int64_t c = threadIdx.x; c < t.cols; c += kThreads) amax = fmaxf(amax, fabsf(load(t.tensor, t.dtype, r * t.cols + c)));
    amax = detail::block_max_all<kThreads>(amax);
    const float inv = kd::int8_inv_scale(amax);
    for (std::int64_t c = threadIdx.x; c < t.cols; c += kThreads) q[r * t.cols + c] = kd::int8_quantise(load(t.tensor, t.dtype, r * t.cols + c), inv);
    if (threadIdx.x == 0) scales[r] = kd::int8_scale(amax);
  }
}

__global__ __launch_bounds__(kThreads) void unpack_kernel(const Task* tasks) {
  const Task t = tasks[blockIdx.x];
  const std::int64_t end = t.row_end * t.cols;
  if (t.wire != WireFormat::kInt8Row) {
    const DType wire = t.wire == WireFormat::kF32 ? DType::kF32 : DType::kBF16;
    for (std::int64_t i = t.row_begin * t.cols + threadIdx.x; i < end; i += kThreads) store(t.tensor, t.dtype, i, load(t.bucket, wire, i));
    return;
  }
  const auto* scales = reinterpret_cast<const float*>(t.bucket);
  const auto* q = reinterpret_cast<const std::int8_t*>(t.bucket + t.data_offset);
  for (std::int64_t i = t.row_begin * t.cols + threadIdx.x; i < end; i += kThreads) store(t.tensor, t.dtype, i, float(q[i]) * scales[i / t.cols]);
}

// The task table: conversion tasks, then (pack only) zero-fill tasks for every padding range.
std::vector<Task> make_tasks(const BucketLayout& layout, std::span<void* const> tensors,
                             std::byte* bucket, bool with_padding) {
  std::vector<Task> tasks;
  for (const kd::BucketTask& bt : kd::bucket_tasks(layout)) {
    const BucketEntry& e = layout.entries[std::size_t(bt.entry)];
    tasks.push_back({tensors[std::size_t(bt.entry)], bucket + e.offset, std::int64_t(e.data_offset),
                     e.spec.cols, bt.row_begin, bt.row_end, e.spec.dtype, e.spec.wire});
  }
  if (!with_padding) return tasks;
  auto zero = [&](std::size_t from, std::size_t to) {
    if (to > from) tasks.push_back({nullptr, bucket, 0, 1, std::int64_t(from), std::int64_t(to), DType::kF32, WireFormat::kF32});
  };
  std::size_t end = 0;
  for (const BucketEntry& e : layout.entries) {
    zero(end, e.offset);
    if (e.spec.wire == WireFormat::kInt8Row) zero(e.offset + 4 * std::size_t(e.spec.rows), e.offset + e.data_offset);
    end = e.offset + e.bytes;
  }
  zero(end, layout.bytes);
  return tasks;
}

Status run(const std::vector<Task>& tasks, bool pack, cudaStream_t s) {
  if (tasks.empty()) return {};
  if (tasks.size() > 0x7fffffffu) return {KernelCode::BadArguments, "bucket: too many tasks"};
  const std::size_t bytes = tasks.size() * sizeof(Task);
  void* table = nullptr;
  cudaError_t err = cudaMallocAsync(&table, bytes, s);
  if (err != cudaSuccess) return detail::cuda_error("bucket: cudaMallocAsync", err);
  // From pageable memory the copy is staged before this returns, so `tasks` may go away after.
  err = cudaMemcpyAsync(table, tasks.data(), bytes, cudaMemcpyHostToDevice, s);
  if (err == cudaSuccess) {
    if (pack) pack_kernel<<<unsigned(tasks.size()), kThreads, 0, s>>>(static_cast<const Task*>(table));
    else unpack_kernel<<<unsigned(tasks.size()), kThreads, 0, s>>>(static_cast<const Task*>(table));
  }
  Status st = err == cudaSuccess ? detail::launch_status("bucket") : detail::cuda_error("bucket: copy", err);
  cudaFreeAsync(table, s);
  return st;
}

}  // namespace

Status pack_bucket(const BucketLayout& layout, std::span<const void* const> tensors,
                   std::byte* bucket, Stream stream) {
  TROUPE_RETURN_IF_ERROR(device_status());
  TROUPE_RETURN_IF_ERROR(kd::check_bucket_io(layout, tensors.size(), bucket, tensors));
  std::vector<void*> ptrs;
  for (const void* p : tensors) ptrs.push_back(const_cast<void*>(p));  // read only in pack_kernel
  return run(make_tasks(layout, ptrs, bucket, true), true, detail::to_stream(stream));
}

Status unpack_bucket(const BucketLayout& layout, const std::byte* bucket,
                     std::span<void* const> tensors, Stream stream) {
  TROUPE_RETURN_IF_ERROR(device_status());
  std::vector<const void*> views(tensors.begin(), tensors.end());
  TROUPE_RETURN_IF_ERROR(kd::check_bucket_io(layout, tensors.size(), bucket, views));
  return run(make_tasks(layout, tensors, const_cast<std::byte*>(bucket), false), false,
             detail::to_stream(stream));
}

}  // namespace troupe::kernels::cuda
