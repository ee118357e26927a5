// Kernel 1 on the GPU: one block per row, one pass over the row with 16-byte streaming loads.
// Each thread keeps an online (max, sum, shifted sum) in the log2 domain; a block reduction
// merges them. DRAM traffic is the logits once plus O(rows) bytes: the bandwidth floor.
#include <cstdint>

#include "common.cuh"
#include "detail/check.hpp"
#include "troupe/kernels/cuda.hpp"

namespace troupe::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kFloor2 = -125.0f;  // log2-domain floor, as detail::kExpFloor on the CPU

// Online softmax statistics in the log2 domain: m = max z2, s = sum 2^(z2 - m),
// t = sum 2^(z2 - m) (z2 - m), where z2 = logit * log2(e) / temperature.
struct Lse {
  float m, s, t;
};

__device__ __forceinline__ Lse rebase(Lse a, float m) {
  if (a.s == 0.0f) return {m, 0.0f, 0.0f};
  const float shift = a.m - m;
  const float e = exp2f(shift);
  return {m, a.s * e, e * (a.t + shift * a.s)};
}

__device__ __forceinline__ Lse merge(Lse a, Lse b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return a;
  a = rebase(a, m);
  b = rebase(b, m);
  return {m, a.s + b.s, a.t + b.t};
}

// Folds kN values already scaled into the log2 domain.
template <int kN>
__device__ __forceinline__ void fold(Lse& st, const float (&z)[kN]) {
  float vm = z[0];
#pragma unroll
  for (int i = 1; i < kN; ++i) vm = fmaxf(vm, z[i]);
  if (vm > st.m) st = rebase(st, vm);
  if (st.m == -INFINITY) return;
#pragma unroll
  for (int i = 0; i < kN; ++i) {
    const float d = fmaxf(z[i] - st.m, kFloor2);
    const float e = exp2f(d);
    st.s += e;
    st.t = fmaf(d, e, st.t);
  }
}

__device__ __forceinline__ float widen(std::uint16_t h) { return __uint_as_float(std::uint32_t(h) << 16); }

// 16 values per step: four float4 loads, or two uint4 loads of 8 bf16 each.
__device__ __forceinline__ void load16(const float* p, float c, float (&z)[16], int step) {
  const float4* v = reinterpret_cast<const float4*>(p);
  float4 q[4];
#pragma unroll
  for (int u = 0; u < 4; ++u) q[u] = __ldcs(v + u * step);
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    z[4 * u] = q[u].x * c, z[4 * u + 1] = q[u].y * c, z[4 * u + 2] = q[u].z * c, z[4 * u + 3] = q[u].w * c;
  }
}

__device__ __forceinline__ void load16(const bf16* p, float c, float (&z)[16], int step) {
  const uint4* v = reinterpret_cast<const uint4*>(p);
  uint4 q[2];
#pragma unroll
  for (int u = 0; u < 2; ++u) q[u] = __ldcs(v + u * step);
#pragma unroll
  for (int u = 0; u < 2; ++u) {
    const std::uint32_t w[4] = {q[u].x, q[u].y, q[u].z, q[u].w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      z[8 * u + 2 * k] = widen(std::uint16_t(w[k] & 0xffffu)) * c;
      z[8 * u + 2 * k + 1] = widen(std::uint16_t(w[k] >> 16)) * c;
    }
  }
}

__device__ __forceinline__ float value(const float* p, std::int64_t i) { return p[i]; }
__device__ __forceinline__ float value(const bf16* p, std::int64_t i) { return widen(p[i].bits); }

template <typename T>
__global__ __launch_bounds__(kThreads) void logprob_kernel(const T* logits, std::int64_t vocab,
                                                           std::int64_t stride, float c,
                                                           bool vector_ok, const std::int64_t* tokens,
                                                           float* logprob, float* entropy) {
  constexpr int kPerPack = 16 / int(sizeof(T));        // elements per 16-byte load
  constexpr std::int64_t kStepElems = std::int64_t(kThreads) * 16;
  const std::int64_t row = blockIdx.x;
  const T* x = logits + row * stride;
  Lse st{-INFINITY, 0.0f, 0.0f};
  std::int64_t done = 0;
  if (vector_ok) {
    for (; done + kStepElems <= vocab; done += kStepElems) {
      float z[16];
      load16(x + done + threadIdx.x * kPerPack, c, z, kThreads);
      fold(st, z);
    }
  }
  for (std::int64_t i = done + threadIdx.x; i < vocab; i += kThreads) {
    const float z[1] = {value(x, i) * c};
    fold(st, z);
  }
  // Block merge: warps by shuffles, then warp 0 over the warps' results.
  for (int o = 16; o > 0; o >>= 1) {
    const Lse other{__shfl_down_sync(~0u, st.m, o), __shfl_down_sync(~0u, st.s, o), __shfl_down_sync(~0u, st.t, o)};
    st = merge(st, other);
  }
  __shared__ Lse warps[kThreads / 32];
  if (threadIdx.x % 32 == 0) warps[threadIdx.x / 32] = st;
  __syncthreads();
  if (threadIdx.x != 0) return;
  Lse r = warps[0];
  for (int w = 1; w < kThreads / 32; ++w) r = merge(r, warps[w]);
  const bool defined = r.m != -INFINITY;
  const float log_s = logf(r.s);
  const std::int64_t tok = tokens[row];
  const bool in_range = tok >= 0 && tok < vocab;
  logprob[row] = defined && in_range ? (value(x, tok) * c - r.m) * kLn2 - log_s : NAN;
  if (entropy) entropy[row] = defined ? log_s - kLn2 * r.t / r.s : NAN;
}

template <typename T>
Status launch(const T* logits, std::int64_t rows, std::int64_t vocab, const std::int64_t* tokens,
              float* logprob, float* entropy, const LogprobOptions& o, Stream stream) {
  TROUPE_RETURN_IF_ERROR(device_status());
  TROUPE_RETURN_IF_ERROR(
      ::troupe::kernels::detail::check_logprob(logits, rows, vocab, tokens, logprob, o));
  if (rows == 0) return {};
  if (rows > 0x7fffffff) return {KernelCode::BadArguments, "logprob_gather: rows > 2^31 - 1"};
  const std::int64_t stride = o.row_stride ? o.row_stride : vocab;
  const bool vector_ok = reinterpret_cast<std::uintptr_t>(logits) % 16 == 0 &&
                         (stride * std::int64_t(sizeof(T))) % 16 == 0;
  const float c = kLog2e / o.temperature;
  logprob_kernel<T><<<unsigned(rows), kThreads, 0, detail::to_stream(stream)>>>(
      logits, vocab, stride, c, vector_ok, tokens, logprob, entropy);
  return detail::launch_status("logprob_gather");
}

}  // namespace

Status logprob_gather(const float* logits, std::int64_t rows, std::int64_t vocab,
                      const std::int64_t* tokens, float* logprob, float* entropy,
                      const LogprobOptions& options, Stream stream) {
  return launch(logits, rows, vocab, tokens, logprob, entropy, options, stream);
}

Status logprob_gather(const bf16* logits, std::int64_t rows, std::int64_t vocab,
                      const std::int64_t* tokens, float* logprob, float* entropy,
                      const LogprobOptions& options, Stream stream) {
  return launch(logits, rows, vocab, tokens, logprob, entropy, options, stream);
}

}  // namespace troupe::kernels::cuda
