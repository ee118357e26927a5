// Kernel 2 on the GPU: a team of T lanes per group (T the smallest power of two >= G, at most a
// warp), with detail::group_advantage's fp64 statistics (the CPU twin's), each sum split over the
// team's lanes and reduced by shuffles. A warp's loads then
// cover 32 consecutive scores (32 / T whole groups), coalesced; one thread per group (the first
// version) read with a stride of G floats and ran at 6.4 x the bandwidth floor on an H200.
#include "common.cuh"
#include "detail/check.hpp"
#include "detail/formulas.hpp"
#include "troupe/kernels/cuda.hpp"

namespace troupe::kernels::cuda {
namespace {

constexpr int kThreads = 256;

template <int T>
__device__ double team_sum(double v, unsigned mask) {
  for (int offset = T / 2; offset > 0; offset >>= 1) v += __shfl_xor_sync(mask, v, offset, T);
  return v;
}

template <int T>
__global__ __launch_bounds__(kThreads) void advantage_kernel(const float* scores, std::int64_t groups,
                                                             std::int64_t g_size, float* adv, float* group_mean,
                                                             float* group_std, double denom, float epsilon,
                                                             bool scale_by_std) {
  const int lane = int(threadIdx.x % T);
  // The lanes of this thread's team within its warp (the loop bound is the same for all of them).
  const unsigned mask = T == 32 ? 0xffffffffu : ((1u << T) - 1u) << (threadIdx.x % 32 / T * T);
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x / T;
  for (std::int64_t g = (std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / T; g < groups; g += stride) {
    const float* s = scores + g * g_size;
    double sum = 0.0;
    for (std::int64_t i = lane; i < g_size; i += T) sum += s[i];
    const double mean = team_sum<T>(sum, mask) / double(g_size);
    double ss = 0.0;
    for (std::int64_t i = lane; i < g_size; i += T) ss += (s[i] - mean) * (s[i] - mean);   // L1 hits
    ss = team_sum<T>(ss, mask);
    const double std_dev = g_size > 1 ? sqrt(ss / denom) : 0.0;
    const double inv = scale_by_std ? 1.0 / (std_dev + epsilon) : 1.0;
    float* a = adv + g * g_size;
    for (std::int64_t i = lane; i < g_size; i += T) a[i] = g_size > 1 ? float((s[i] - mean) * inv) : 0.0f;
    if (lane == 0 && group_mean) group_mean[g] = float(mean);
    if (lane == 0 && group_std) group_std[g] = float(std_dev);
  }
}

template <int T>
void launch(const float* scores, std::int64_t groups, std::int64_t g_size, float* adv, float* mean, float* std_dev,
            double denom, const AdvantageOptions& o, cudaStream_t s) {
  advantage_kernel<T><<<detail::grid_for(groups * T, kThreads), kThreads, 0, s>>>(
      scores, groups, g_size, adv, mean, std_dev, denom, o.epsilon, o.scale_by_std);
}

}  // namespace

Status group_advantages(const float* scores, std::int64_t groups, std::int64_t group_size,
                        float* advantages, float* group_mean, float* group_std,
                        const AdvantageOptions& o, Stream stream) {
  TROUPE_RETURN_IF_ERROR(device_status());
  TROUPE_RETURN_IF_ERROR(::troupe::kernels::detail::check_advantages(
      scores, groups, group_size, advantages, o));
  if (groups == 0) return {};
  const double denom = o.unbiased_std ? double(group_size - 1) : double(group_size);
  cudaStream_t s = detail::to_stream(stream);
  if (group_size > 16) launch<32>(scores, groups, group_size, advantages, group_mean, group_std, denom, o, s);
  else if (group_size > 8) launch<16>(scores, groups, group_size, advantages, group_mean, group_std, denom, o, s);
  else if (group_size > 4) launch<8>(scores, groups, group_size, advantages, group_mean, group_std, denom, o, s);
  else if (group_size > 2) launch<4>(scores, groups, group_size, advantages, group_mean, group_std, denom, o, s);
  else if (group_size > 1) launch<2>(scores, groups, group_size, advantages, group_mean, group_std, denom, o, s);
  else launch<1>(scores, groups, group_size, advantages, group_mean, group_std, denom, o, s);
  return detail::launch_status("group_advantages");
}

}  // namespace troupe::kernels::cuda
