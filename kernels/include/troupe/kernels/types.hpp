#pragma once
// Shared vocabulary of troupe::kernels: the status type, the bf16 storage type, streams, threads.
// No torch and no CUDA header here: every public header of kernels/ compiles on a CPU-only box.

#include <bit>
#include <cstdint>
#include <string>
#include <utility>

#include "troupe/error.hpp"

namespace troupe::kernels {

// A cudaStream_t passed opaquely. Only the kernels::cuda entry points take one; nullptr there is
// the CUDA legacy default stream. The CPU twins run on the calling thread (plus helpers, see below).
using Stream = void*;

// Every kernel answers a troupe::Status: ok, or an Error with a KernelCode (troupe/error.hpp:
// BadArguments, Unavailable, DeviceError; each says whether a retry can help).
using troupe::KernelCode;
using troupe::Status;

// bfloat16 storage: the top 16 bits of an IEEE float. Layout-compatible with at::BFloat16 and
// __nv_bfloat16, so a torch bf16 tensor's data_ptr can be reinterpret_cast to `const bf16*`.
struct bf16 {
  std::uint16_t bits = 0;
};
static_assert(sizeof(bf16) == 2);

// Exact widening.
inline float to_float(bf16 h) { return std::bit_cast<float>(std::uint32_t(h.bits) << 16); }

// Round to nearest even; NaN stays NaN (quiet), overflow rounds to +-inf as IEEE says.
inline bf16 to_bf16(float f) {
  std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{std::uint16_t((u >> 16) | 0x40u)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{std::uint16_t(u >> 16)};
}

// Threads the CPU twins may use per call (the caller's thread counts as one). Default: the
// hardware concurrency. Small calls run on the caller alone. Thread-safe; n < 1 means 1.
void set_num_threads(int n);
int num_threads();

// True when this library was built with CUDA and a CUDA device is usable now. Cheap after the
// first call (the probe is cached).
bool cuda_available();

}  // namespace troupe::kernels
