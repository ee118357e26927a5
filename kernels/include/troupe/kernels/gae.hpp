#pragma once
// Kernel 6: generalised advantage estimation for PPO (Schulman et al. 2016, "High-Dimensional
// Continuous Control Using Generalized Advantage Estimation", arXiv:1506.02438, eq. 16), a reverse
// scan over each response's tokens.

#include <cstdint>

#include "troupe/kernels/types.hpp"

namespace troupe::kernels {

struct GaeOptions {
  float gamma = 1.0f;    // discount, in [0, 1]
  float lambda = 0.95f;  // GAE's lambda, in [0, 1]: 0 is the one-step TD error, 1 the Monte-Carlo return less V
};

// Shapes: rewards, values, advantages, returns [rows x tokens], one response per row, its tokens
// in order; mask [rows x tokens] of 0/1 bytes or nullptr for all valid. Per row, from the last
// token back, over the valid tokens only (a masked token is skipped: the recursion carries over it,
// so interior and left padding change nothing):
//   delta_t = rewards_t + gamma * V_next - values_t        (V_next = 0 after the row's last valid token)
//   A_t     = delta_t + gamma * lambda * A_next            (A_next = 0 there too)
//   advantages_t = A_t,  returns_t = A_t + values_t         (the critic's target)
// Masked tokens get advantage 0 and return 0; every element is written. The recursion runs in fp64;
// |error| <= 1e-5 * (1 + |reference|) against an fp64 reference.
Status gae(const float* rewards, const float* values, const std::uint8_t* mask, std::int64_t rows,
           std::int64_t tokens, float* advantages, float* returns, const GaeOptions& options = {});

}  // namespace troupe::kernels
