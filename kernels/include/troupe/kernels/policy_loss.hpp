#pragma once
// Kernel 4: the clipped surrogate loss of PPO (Schulman et al. 2017) / GRPO, its value and its
// gradient with respect to the current logprobs, in one pass.

#include <cstdint>

#include "troupe/kernels/types.hpp"

namespace troupe::kernels {

// How token losses become one number; `n_s` is sequence s's count of valid tokens, `S` the number
// of sequences with at least one valid token, `N` the total count of valid tokens.
enum class LossAggregation : std::uint8_t {
  kTokenMean,         // sum_t l_t / N                       (DAPO; verl "token-mean")
  kSeqMeanTokenMean,  // (1/S) sum_s (1/n_s) sum_{t in s} l_t (GRPO paper; "seq-mean-token-mean")
  kSeqMeanTokenSum,   // (1/S) sum_s sum_{t in s} l_t         ("seq-mean-token-sum")
};

struct PolicyLossOptions {
  float clip_low = 0.2f;   // ratio is clipped to [1 - clip_low, 1 + clip_high]
  float clip_high = 0.2f;  // DAPO's clip-higher uses e.g. 0.28
  float dual_clip = 0.0f;  // > 1 enables dual-clip PPO (Ye et al. 2020): for A < 0, l <= -A * c
  LossAggregation aggregation = LossAggregation::kTokenMean;
};

// Shapes: logp, old_logp, advantages, grad_logp [rows x tokens] row-major (a row is one sequence);
// mask the same shape of 0/1 bytes, or nullptr for all valid; loss and clip_fraction are scalars
// (clip_fraction may be nullptr).
//   r_t = exp(clamp(logp_t - old_logp_t, -20, 20))
//   l_t = max(-A_t r_t, -A_t clip(r_t, 1 - clip_low, 1 + clip_high)), then min(l_t, -A_t c) if A_t < 0
//   loss = sum_t w_t l_t with w_t from the aggregation (0 for masked tokens)
//   grad_logp_t = d loss / d logp_t = w_t * (-A_t r_t) where the unclipped term is active, else 0
//   clip_fraction = share of valid tokens whose clipped term is strictly larger (verl's pg_clipfrac)
// No valid token at all: loss 0, grad 0, clip_fraction 0. Sums in fp32 per 1,024-token block,
// fp64 across blocks and rows (in row order: the result does not depend on threads); |error| <= 1e-5 *
// (1 + |reference|) for the loss and for each gradient element against fp64.
Status policy_loss(const float* logp, const float* old_logp, const float* advantages,
                   const std::uint8_t* mask, std::int64_t rows, std::int64_t tokens, float* loss,
                   float* grad_logp, float* clip_fraction = nullptr,
                   const PolicyLossOptions& options = {});

}  // namespace troupe::kernels
