// Kernel 6 on the GPU: one thread per row runs detail::gae_row (the CPU twin's scan, fp64), since
// the recursion is sequential along a row. A warp's threads read 32 rows a row apart (not
// coalesced), and a batch has only as many threads as responses: this first version is latency
// bound. A chunked scan (each token an affine map A -> delta + gamma*lambda*A, composed by a warp
// scan) would put a warp on each row. Not measured on a device yet (bench/device/kernels.sh).
#include "common.cuh"
#include "detail/check.hpp"
#include "detail/formulas.hpp"
#include "troupe/kernels/cuda.hpp"

namespace troupe::kernels::cuda {
namespace {

constexpr int kThreads = 128;

__global__ __launch_bounds__(kThreads) void gae_kernel(const float* rewards, const float* values,
                                                       const std::uint8_t* mask, std::int64_t rows,
                                                       std::int64_t tokens, double gamma, double gamma_lambda,
                                                       float* adv, float* ret) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t row = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; row < rows; row += stride) {
    const std::int64_t at = row * tokens;
    ::troupe::kernels::detail::gae_row(rewards + at, values + at, mask ? mask + at : nullptr, tokens, gamma, gamma_lambda, adv + at,
                    ret + at);
  }
}

}  // namespace

Status gae(const float* rewards, const float* values, const std::uint8_t* mask, std::int64_t rows,
           std::int64_t tokens, float* advantages, float* returns, const GaeOptions& o, Stream stream) {
  TROUPE_RETURN_IF_ERROR(device_status());
  TROUPE_RETURN_IF_ERROR(::troupe::kernels::detail::check_gae(rewards, values, rows, tokens, advantages, returns, o));
  if (rows == 0 || tokens == 0) return {};
  gae_kernel<<<detail::grid_for(rows, kThreads), kThreads, 0, detail::to_stream(stream)>>>(
      rewards, values, mask, rows, tokens, o.gamma, double(o.gamma) * double(o.lambda), advantages, returns);
  return detail::launch_status("gae");
}

}  // namespace troupe::kernels::cuda
