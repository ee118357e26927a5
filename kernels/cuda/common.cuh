#pragma once
// Helpers shared by the CUDA kernels: stream casts, the device probe, launch checks, block
// reductions. Included only by .cu files; public headers stay free of CUDA types.

#include <cuda_runtime.h>

#include <string>

#include "troupe/kernels/types.hpp"

namespace troupe::kernels::cuda::detail {

inline cudaStream_t to_stream(Stream s) { return static_cast<cudaStream_t>(s); }

inline Status cuda_error(const char* what, cudaError_t err) {
  return {KernelCode::DeviceError, std::string(what) + ": " + cudaGetErrorString(err)};
}

// After a launch: the launch's own error (bad configuration, no kernel image), if any.
inline Status launch_status(const char* what) {
  const cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? Status{} : cuda_error(what, err);
}

inline int grid_for(std::int64_t n, int threads, int max_blocks = 132 * 16) {
  const std::int64_t blocks = (n + threads - 1) / threads;
  return int(blocks < 1 ? 1 : (blocks > max_blocks ? max_blocks : blocks));
}

// Sum over a block of kThreads threads (a multiple of 32); the result is valid in thread 0.
// The order of additions is fixed, so results are deterministic run to run.
template <int kThreads, typename T>
__device__ T block_sum(T v) {
  static_assert(kThreads % 32 == 0 && kThreads <= 1024);
  __shared__ T warp_sums[kThreads / 32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = v;
  __syncthreads();
  T total = T(0);
  if (threadIdx.x == 0) {
    for (int w = 0; w < kThreads / 32; ++w) total += warp_sums[w];
  }
  __syncthreads();  // warp_sums may be reused by the caller's next reduction
  return total;
}

// Max over a block; the result is valid in every thread.
template <int kThreads>
__device__ float block_max_all(float v) {
  __shared__ float warp_max[kThreads / 32];
  __shared__ float result;
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_down_sync(0xffffffffu, v, o));
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    float m = warp_max[0];
    for (int w = 1; w < kThreads / 32; ++w) m = fmaxf(m, warp_max[w]);
    result = m;
  }
  __syncthreads();
  return result;
}

}  // namespace troupe::kernels::cuda::detail

namespace troupe::kernels::cuda {
// Defined in device.cu; every entry point returns it first when it is not ok.
Status device_status();
}  // namespace troupe::kernels::cuda
