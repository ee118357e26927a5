// The device probe: built with CUDA, a device is usable when the runtime initialises and counts
// at least one. Probed once per process; without a driver this is cudaErrorInsufficientDriver.

#include "common.cuh"
#include "troupe/kernels/cuda.hpp"

namespace troupe::kernels {
namespace {

const Status& probe() {
  static const Status status = [] {
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
      cudaGetLastError();  // clear the sticky-free error so later calls start clean
      return Status{KernelCode::Unavailable,
                    std::string("no usable CUDA device: ") + cudaGetErrorString(err)};
    }
    if (count == 0) return Status{KernelCode::Unavailable, "no CUDA device found"};
    return Status{};
  }();
  return status;
}

}  // namespace

bool cuda_available() { return probe().ok(); }

Status cuda::device_status() { return probe(); }

}  // namespace troupe::kernels
