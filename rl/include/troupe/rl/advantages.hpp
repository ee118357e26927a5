// Advantage estimators (torch-free: plain vectors in, plain vectors out; math in troupe::kernels).
#pragma once

#include <cstdint>
#include <vector>

namespace troupe::rl {

// GRPO outcome advantages (Shao et al. 2024, arXiv:2402.03300, sec. 4.1.2).
// rewards [B * G], the G samples of one prompt adjacent -> [B * G]:
//   A_i = (r_i - mean_g) / (std_g + eps), std unbiased (divides by G - 1) as torch.std and verl;
//   a group whose rewards are all equal gets A = 0 (it carries no signal).
// Throws std::invalid_argument when rewards.size() is not a multiple of group_size.
std::vector<float> group_advantages(const std::vector<float>& rewards, std::int64_t group_size, double eps = 1e-6);

}  // namespace troupe::rl
