// Kernel 4 on the GPU, deterministic and in three launches:
//   1. count: one block per row counts its valid tokens; integer atomics give the totals.
//   2. loss:  one block per row writes the weighted gradient and its row's loss and clip count.
//   3. final: one block adds the row results in a fixed order into the scalars.
// Launch 1 reads only the mask (1 byte per token) so that launch 2 knows every weight up front.
#include "common.cuh"
#include "detail/check.hpp"
#include "detail/formulas.hpp"
#include "troupe/kernels/cuda.hpp"

namespace troupe::kernels::cuda {
namespace {

namespace kd = ::troupe::kernels::detail;
constexpr int kThreads = 256;

struct Totals {
  unsigned long long tokens;
  unsigned long long nonempty;
};

struct RowResult {
  double loss;
  unsigned long long clipped;
};

struct DeviceExp {
  __device__ float operator()(float x) const { return expf(x); }
};

__global__ __launch_bounds__(kThreads) void count_kernel(const std::uint8_t* mask,
                                                         std::int64_t tokens,
                                                         unsigned long long* row_count,
                                                         Totals* totals) {
  const std::int64_t base = blockIdx.x * tokens;
  unsigned long long c = 0;
  for (std::int64_t i = threadIdx.x; i < tokens; i += kThreads) c += mask ? (mask[base + i] != 0) : 1;
  c = detail::block_sum<kThreads>(c);
  if (threadIdx.x == 0) {
    row_count[blockIdx.x] = c;
    atomicAdd(&totals->tokens, c);
    atomicAdd(&totals->nonempty, c > 0 ? 1ull : 0ull);
  }
}

__global__ __launch_bounds__(kThreads) void loss_kernel(
    const float* logp, const float* old_logp, const float* adv, const std::uint8_t* mask,
    std::int64_t tokens, const unsigned long long* row_count, const Totals* totals,
    PolicyLossOptions o, float* grad, RowResult* rows_out) {
  const std::int64_t base = blockIdx.x * tokens;
  const float w = float(kd::loss_weight(o.aggregation, std::int64_t(row_count[blockIdx.x]),
                                        std::int64_t(totals->tokens),
                                        std::int64_t(totals->nonempty)));
  double loss = 0.0;
  unsigned long long clipped = 0;
  for (std::int64_t i = base + threadIdx.x; i < base + tokens; i += kThreads) {
    const kd::PpoTerm t = kd::ppo_term(__ldcs(logp + i), __ldcs(old_logp + i), __ldcs(adv + i),
                                       o.clip_low, o.clip_high, o.dual_clip, DeviceExp{});
    const bool valid = mask == nullptr || mask[i] != 0;
    __stcs(grad + i, valid ? w * t.grad : 0.0f);
    loss += valid ? double(t.loss) : 0.0;
    clipped += valid && t.clipped != 0.0f ? 1 : 0;
  }
  loss = detail::block_sum<kThreads>(loss);
  clipped = detail::block_sum<kThreads>(clipped);
  if (threadIdx.x == 0) rows_out[blockIdx.x] = {loss * w, clipped};
}

__global__ __launch_bounds__(kThreads) void final_kernel(const RowResult* rows_in, std::int64_t rows,
                                                         const Totals* totals, float* loss,
                                                         float* clip_fraction) {
  double l = 0.0;
  unsigned long long c = 0;
  for (std::int64_t r = threadIdx.x; r < rows; r += kThreads) l += rows_in[r].loss, c += rows_in[r].clipped;
  l = detail::block_sum<kThreads>(l);
  c = detail::block_sum<kThreads>(c);
  if (threadIdx.x != 0) return;
  *loss = float(l);
  if (clip_fraction) *clip_fraction = totals->tokens ? float(double(c) / double(totals->tokens)) : 0.0f;
}

}  // namespace

Status policy_loss(const float* logp, const float* old_logp, const float* advantages,
                   const std::uint8_t* mask, std::int64_t rows, std::int64_t tokens, float* loss,
                   float* grad_logp, float* clip_fraction, const PolicyLossOptions& o,
                   Stream stream) {
  TROUPE_RETURN_IF_ERROR(device_status());
  TROUPE_RETURN_IF_ERROR(
      kd::check_policy_loss(logp, old_logp, advantages, rows, tokens, loss, grad_logp, o));
  if (rows > 0x7fffffff) return {KernelCode::BadArguments, "policy_loss: rows > 2^31 - 1"};
  if (tokens == 0) rows = 0;
  cudaStream_t s = detail::to_stream(stream);
  const std::size_t bytes = sizeof(Totals) + std::size_t(rows) * (8 + sizeof(RowResult));
  void* work = nullptr;
  cudaError_t err = cudaMallocAsync(&work, bytes, s);
  if (err != cudaSuccess) return detail::cuda_error("policy_loss: cudaMallocAsync", err);
  auto* totals = static_cast<Totals*>(work);
  auto* row_count = reinterpret_cast<unsigned long long*>(totals + 1);
  auto* row_out = reinterpret_cast<RowResult*>(row_count + rows);
  err = cudaMemsetAsync(totals, 0, sizeof(Totals), s);
  if (err == cudaSuccess && rows > 0) {
    count_kernel<<<unsigned(rows), kThreads, 0, s>>>(mask, tokens, row_count, totals);
    loss_kernel<<<unsigned(rows), kThreads, 0, s>>>(logp, old_logp, advantages, mask, tokens,
                                                    row_count, totals, o, grad_logp, row_out);
  }
  if (err == cudaSuccess) {
    final_kernel<<<1, kThreads, 0, s>>>(row_out, rows, totals, loss, clip_fraction);
  }
  Status st = err == cudaSuccess ? detail::launch_status("policy_loss")
                                 : detail::cuda_error("policy_loss: cudaMemsetAsync", err);
  cudaFreeAsync(work, s);
  return st;
}

}  // namespace troupe::kernels::cuda
