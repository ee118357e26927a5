// A CUDA status as the GPU helpers report it (gpu_sync.cpp, nccl_broadcast.cpp): true on success,
// else false with the message in `error`. A failure handled here is also cleared from the thread's
// last-error slot, so that the thread's next kernel launch does not report it as its own. And
// OnDevice, which makes a device current for a scope.
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

// Makes `device` current on this thread for the guard's life, then restores the caller's device.
class OnDevice {
 public:
  OnDevice(int device, std::string* error) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    ok_ = cuda_ok(cudaSetDevice(device), error);
  }
  ~OnDevice() {
    if (previous_ >= 0) (void)cudaSetDevice(previous_);
  }
  OnDevice(const OnDevice&) = delete;
  OnDevice& operator=(const OnDevice&) = delete;
  explicit operator bool() const { return ok_; }

 private:
  int previous_ = -1;
  bool ok_ = false;
};

}  // namespace troupe::detail::weights::gpu
