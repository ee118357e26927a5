#pragma once
// Kernel 2: group-normalised advantages for GRPO (Shao et al. 2024, arXiv:2402.03300, sec. 4.1.2).

#include <cstdint>

#include "troupe/kernels/types.hpp"

namespace troupe::kernels {

struct AdvantageOptions {
  float epsilon = 1e-6f;      // added to the std before dividing
  bool scale_by_std = true;   // false: advantages are only centred (Dr. GRPO, arXiv:2503.20783)
  bool unbiased_std = true;   // divide the squared deviations by G - 1 (torch.std's default)
};

// Shapes: scores [groups x group_size], the responses of one prompt contiguous (as verl's
// repeat_interleave lays them out); advantages the same shape; group_mean, group_std [groups]
// or nullptr.
//   advantages[g][i] = (scores[g][i] - mean_g) / (std_g + epsilon)   (or without the division)
// group_size 1: std is taken as 0, so the advantage is 0 (one sample has no peer to beat).
// Statistics are accumulated in fp64; |error| <= 1e-5 * (1 + |reference|) against an fp64 reference.
Status group_advantages(const float* scores, std::int64_t groups, std::int64_t group_size,
                        float* advantages, float* group_mean = nullptr,
                        float* group_std = nullptr, const AdvantageOptions& options = {});

}  // namespace troupe::kernels
