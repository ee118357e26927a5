// Kernel 3 on the GPU: an elementwise grid-stride map with the shared formula of formulas.hpp.
#include "common.cuh"
#include "detail/check.hpp"
#include "detail/formulas.hpp"
#include "troupe/kernels/cuda.hpp"

namespace troupe::kernels::cuda {
namespace {

constexpr int kThreads = 256;

struct DeviceExp {
  __device__ float operator()(float x) const { return expf(x); }
};

__global__ void kl_kernel(const float* logp, const float* ref, const std::uint8_t* mask,
                          std::int64_t n, KlEstimator est, float clamp, float* kl) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    const float v = ::troupe::kernels::detail::kl_term(__ldcs(logp + i), __ldcs(ref + i), est,
                                                       clamp, DeviceExp{});
    __stcs(kl + i, mask == nullptr || mask[i] ? v : 0.0f);
  }
}

}  // namespace

Status kl_penalty(const float* logp, const float* ref_logp, const std::uint8_t* mask,
                  std::int64_t n, float* kl, const KlOptions& o, Stream stream) {
  TROUPE_RETURN_IF_ERROR(device_status());
  TROUPE_RETURN_IF_ERROR(::troupe::kernels::detail::check_kl(logp, ref_logp, n, kl, o));
  if (n == 0) return {};
  kl_kernel<<<detail::grid_for(n, kThreads), kThreads, 0, detail::to_stream(stream)>>>(
      logp, ref_logp, mask, n, o.estimator, o.log_ratio_clamp, kl);
  return detail::launch_status("kl_penalty");
}

}  // namespace troupe::kernels::cuda
