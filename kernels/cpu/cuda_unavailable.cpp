// Built instead of cuda/*.cu when nvcc was not found: every CUDA entry point says so, touching
// nothing, so callers compile and link the same way on every machine and fall back to the CPU.
#include "troupe/kernels/cuda.hpp"

namespace troupe::kernels {

bool cuda_available() { return false; }

namespace cuda {
namespace {

Status unavailable() {
  return {KernelCode::Unavailable, "troupe::kernels was built without CUDA (nvcc not found)"};
}

}  // namespace

Status device_status() { return unavailable(); }

Status logprob_gather(const float*, std::int64_t, std::int64_t, const std::int64_t*, float*, float*,
                      const LogprobOptions&, Stream) {
  return unavailable();
}
Status logprob_gather(const bf16*, std::int64_t, std::int64_t, const std::int64_t*, float*, float*,
                      const LogprobOptions&, Stream) {
  return unavailable();
}
Status group_advantages(const float*, std::int64_t, std::int64_t, float*, float*, float*,
                        const AdvantageOptions&, Stream) {
  return unavailable();
}
Status kl_penalty(const float*, const float*, const std::uint8_t*, std::int64_t, float*,
                  const KlOptions&, Stream) {
  return unavailable();
}
Status gae(const float*, const float*, const std::uint8_t*, std::int64_t, std::int64_t, float*, float*,
           const GaeOptions&, Stream) {
  return unavailable();
}
Status policy_loss(const float*, const float*, const float*, const std::uint8_t*, std::int64_t,
                   std::int64_t, float*, float*, float*, const PolicyLossOptions&, Stream) {
  return unavailable();
}
Status pack_bucket(const BucketLayout&, std::span<const void* const>, std::byte*, Stream) {
  return unavailable();
}
Status unpack_bucket(const BucketLayout&, const std::byte*, std::span<void* const>, Stream) {
  return unavailable();
}

}  // namespace cuda
}  // namespace troupe::kernels
