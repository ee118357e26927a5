// A CUDA status as the GPU helpers report it (gpu_sync.cpp, nccl_broadcast.cpp): true on success,
// else false with the message in `error`. A failure handled here is also cleared from the thread's
// last-error slot, so that the thread's next kernel launch does not report it as its own.
// Include only where the CUDA toolkit is (TROUPE_WEIGHTS_GPU / TROUPE_WEIGHTS_NCCL builds).
#pragma once

#include <cuda_runtime_api.h>

#include <string>

namespace troupe::detail::weights::gpu {

inline bool cuda_ok(cudaError_t e, std::string* error) {
  if (e == cudaSuccess) return true;
  (void)cudaGetLastError();
  if (error) *error = std::string("cuda: ") + cudaGetErrorString(e);
  return false;
}

}  // namespace troupe::detail::weights::gpu
