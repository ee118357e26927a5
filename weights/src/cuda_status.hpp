// A CUDA status as the GPU helpers report it (gpu_sync.cpp, nccl_broadcast.cpp): true on success,
// else false with the message in `error`. A failure handled here is also cleared from the thread's
// last-error slot, so that the thread's next kernel launch does not report it as its own. And
// OnDevice, which makes a device current for a scope.
// Include only where the CUDA toolkit is (TROUPE_WEIGHTS_GPU / TROUPE_WEIGHTS_NCCL builds).
#pragma once

#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <string>

namespace troupe::detail::weights::gpu {

inline bool cuda_ok(cudaError_t e, std::string* error) {
  if (e == cudaSuccess) return true;
  (void)cudaGetLastError();
  if (error) *error = std::string("cuda: ") + cudaGetErrorString(e);
  return false;
}

// Whether `device`'s primary context is active in this process: the driver's
// cuDevicePrimaryCtxGetState, found in the libcuda.so.1 the CUDA runtime has loaded (no link to
// it, any toolkit version). True when that cannot be asked: then the caller's device is restored
// as before, at the cost this check exists to avoid.
inline bool context_active(int device) {
  using GetState = int (*)(int, unsigned int*, int*);   // CUresult (CUdevice, unsigned*, int*)
  static const GetState get_state = [] {
    void* cuda = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    return cuda ? reinterpret_cast<GetState>(dlsym(cuda, "cuDevicePrimaryCtxGetState")) : GetState(nullptr);
  }();
  unsigned int flags = 0;
  int active = 1;
  return get_state == nullptr || get_state(device, &flags, &active) != 0 || active != 0;
}

// Makes `device` current on this thread for the guard's life, then restores the caller's device
// if the caller used it: a thread on the default device 0 of a process that never used GPU 0 is
// left on `device`, since making GPU 0 current again would create a context there (hundreds of
// MB of another process's GPU, a trainer's, say).
class OnDevice {
 public:
  OnDevice(int device, std::string* error) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    ok_ = previous_ == device || cuda_ok(cudaSetDevice(device), error);
    if (previous_ == device) previous_ = -1;   // nothing to restore
  }
  ~OnDevice() {
    if (previous_ >= 0 && context_active(previous_)) (void)cudaSetDevice(previous_);
  }
  OnDevice(const OnDevice&) = delete;
  OnDevice& operator=(const OnDevice&) = delete;
  explicit operator bool() const { return ok_; }

 private:
  int previous_ = -1;
  bool ok_ = false;
};

}  // namespace troupe::detail::weights::gpu
