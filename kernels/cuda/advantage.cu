// Kernel 2 on the GPU: one thread per group, fp64 statistics as on the CPU. Groups are small
// (G = 4..64) and the scores of a batch are a few KB, so this launch is latency-bound in practice;
// a thread's group is contiguous, so a warp still reads whole cache lines.
#include "common.cuh"
#include "detail/check.hpp"
#include "detail/formulas.hpp"
#include "troupe/kernels/cuda.hpp"

namespace troupe::kernels::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void advantage_kernel(const float* scores, std::int64_t groups, std::int64_t g_size,
                                 float* adv, float* group_mean, float* group_std, double denom,
                                 float epsilon, bool scale_by_std) {
  for (std::int64_t g = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; g < groups;
       g += std::int64_t(gridDim.x) * blockDim.x) {
    double mean, std_dev;
    ::troupe::kernels::detail::group_advantage(scores + g * g_size, g_size, denom, epsilon, scale_by_std,
                                               adv + g * g_size, &mean, &std_dev);
    if (group_mean) group_mean[g] = float(mean);
    if (group_std) group_std[g] = float(std_dev);
  }
}

}  // namespace

Status group_advantages(const float* scores, std::int64_t groups, std::int64_t group_size,
                        float* advantages, float* group_mean, float* group_std,
                        const AdvantageOptions& o, Stream stream) {
  TROUPE_KERNELS_RETURN_IF_ERROR(device_status());
  TROUPE_KERNELS_RETURN_IF_ERROR(::troupe::kernels::detail::check_advantages(
      scores, groups, group_size, advantages, o));
  if (groups == 0) return {};
  const double denom = o.unbiased_std ? double(group_size - 1) : double(group_size);
  advantage_kernel<<<detail::grid_for(groups, kThreads), kThreads, 0, detail::to_stream(stream)>>>(
      scores, groups, group_size, advantages, group_mean, group_std, denom, o.epsilon,
      o.scale_by_std);
  return detail::launch_status("group_advantages");
}

}  // namespace troupe::kernels::cuda
