#pragma once
// Kernel 3: per-token KL estimators between the policy and a reference policy
// (Schulman, "Approximating KL divergence", 2020): unbiased k1, low-variance k2 and k3.

#include <cstdint>

#include "troupe/kernels/types.hpp"

namespace troupe::kernels {

enum class KlEstimator : std::uint8_t {
  kK1,  // logp - ref_logp
  kK2,  // 0.5 * (logp - ref_logp)^2
  kK3,  // exp(ref_logp - logp) - (ref_logp - logp) - 1   (GRPO's "low_var_kl")
};

struct KlOptions {
  KlEstimator estimator = KlEstimator::kK3;
  // k3 only: ref_logp - logp is clamped to [-c, c] before exp so that it cannot overflow
  // (verl uses 20). 0 disables the clamp.
  float log_ratio_clamp = 20.0f;
};

// Shapes: logp, ref_logp, kl [n]; mask [n] of 0/1 bytes (a torch bool tensor's data) or nullptr
// for all valid. kl[i] = mask[i] ? k(logp[i], ref_logp[i]) : 0; every element is written.
// Float math per element; |error| <= 1e-5 * (1 + |reference|) against fp64.
Status kl_penalty(const float* logp, const float* ref_logp, const std::uint8_t* mask,
                  std::int64_t n, float* kl, const KlOptions& options = {});

}  // namespace troupe::kernels
