// The KL coefficient of a KL-penalised reward, fixed or adaptive (torch-free).
#pragma once

#include <cstdint>

namespace troupe::rl {

// Ziegler et al. 2019, "Fine-Tuning Language Models from Human Preferences", arXiv:1909.08593,
// sec. 2.2: after each batch, with the batch's measured KL (per sample, nats) and n_steps samples,
//   e = clip(kl / target - 1, -0.2, 0.2),   coef <- coef * (1 + e * n_steps / horizon).
// target <= 0 makes it a fixed coefficient (update changes nothing). n_steps must stay under
// 5 * horizon: beyond it the factor 1 + e * n_steps / horizon can reach zero or turn negative (a
// negative coefficient would reward drifting from the reference).
class KlController {
 public:
  KlController(double initial_coef, double target_kl = 0.0, double horizon = 10000.0);
  double value() const { return coef_; }
  // Returns the new coefficient. Throws std::invalid_argument for n_steps < 0, n_steps >= 5 *
  // horizon (an adaptive one) or a non-finite kl.
  double update(double measured_kl, std::int64_t n_steps);

 private:
  double coef_, target_, horizon_;
};

}  // namespace troupe::rl
