#pragma once
// Per-element formulas shared by the CPU twins and the CUDA kernels, so that both compute the
// same expression in the same order. Compiled as __host__ __device__ under nvcc.

#include <cmath>
#include <cstdint>

#include "troupe/kernels/kl.hpp"
#include "troupe/kernels/policy_loss.hpp"

#if defined(__CUDACC__)
#define TROUPE_HD __host__ __device__ __forceinline__
#else
#define TROUPE_HD inline
#endif

namespace troupe::kernels::detail {

inline constexpr float kLogRatioClampPpo = 20.0f;  // PPO: |logp - old_logp| clamp before exp

TROUPE_HD float clampf(float x, float lo, float hi) { return x < lo ? lo : (x > hi ? hi : x); }

// Tokens [begin, end) of one row of gae, last first, from the state the scan carries in from the
// right (the next valid token's value and advantage), which it leaves updated. The same on the CPU
// and the GPU (the CUDA kernel runs it per lane chunk from a scanned state).
TROUPE_HD void gae_steps(const float* r, const float* v, const std::uint8_t* m, std::int64_t begin, std::int64_t end,
                         double gamma, double gamma_lambda, double& next_value, double& next_adv, float* adv,
                         float* ret) {
  for (std::int64_t t = end - 1; t >= begin; --t) {
    if (m != nullptr && m[t] == 0) {
      adv[t] = 0.0f;
      ret[t] = 0.0f;
      continue;
    }
    const double value = v[t];
    const double a = double(r[t]) + gamma * next_value - value + gamma_lambda * next_adv;
    adv[t] = float(a);
    ret[t] = float(a + value);
    next_value = value;
    next_adv = a;
  }
}

// One row of gae: the reverse scan over `tokens` (see gae.hpp).
TROUPE_HD void gae_row(const float* r, const float* v, const std::uint8_t* m, std::int64_t tokens, double gamma,
                       double gamma_lambda, float* adv, float* ret) {
  double next_value = 0.0, next_adv = 0.0;
  gae_steps(r, v, m, 0, tokens, gamma, gamma_lambda, next_value, next_adv, adv, ret);
}

// One group of group_advantages: writes the G advantages of `s` into `a` and returns the group's
// mean and std through `mean_out`, `std_out`. `denom` is G-1 (unbiased) or G. A group of one has no
// peer: its advantage is 0 even when epsilon is 0.
TROUPE_HD void group_advantage(const float* s, std::int64_t g_size, double denom, float epsilon, bool scale_by_std,
                               float* a, double* mean_out, double* std_out) {
  double mean = 0.0;
  for (std::int64_t i = 0; i < g_size; ++i) mean += s[i];
  mean /= double(g_size);
  double ss = 0.0;
  for (std::int64_t i = 0; i < g_size; ++i) ss += (s[i] - mean) * (s[i] - mean);
  const double std_dev = g_size > 1 ? sqrt(ss / denom) : 0.0;
  const double inv = scale_by_std ? 1.0 / (std_dev + epsilon) : 1.0;
  for (std::int64_t i = 0; i < g_size; ++i) a[i] = g_size > 1 ? float((s[i] - mean) * inv) : 0.0f;
  *mean_out = mean;
  *std_out = std_dev;
}

// `exp_fn` is the exponential each side uses: detail::fast_exp on CPU (vectorisable), expf on GPU.

// One token of kl_penalty (unmasked).
template <typename ExpFn>
TROUPE_HD float kl_term(float logp, float ref, KlEstimator est, float clamp, ExpFn exp_fn) {
  const float d = logp - ref;
  if (est == KlEstimator::kK1) return d;
  if (est == KlEstimator::kK2) return 0.5f * d * d;
  // Branch-free (a disabled clamp is an infinite one) so that CPU loops vectorise.
  const float c = clamp > 0.0f ? clamp : INFINITY;
  const float lr = clampf(ref - logp, -c, c);
  return exp_fn(lr) - lr - 1.0f;
}

// One token of the clipped surrogate: its loss, d loss / d logp (unweighted), and whether the
// clipped term is strictly the larger (verl's pg_clipfrac).
struct PpoTerm {
  float loss;
  float grad;
  float clipped;  // 1 or 0; a float so that CPU loops keep one lane width
};

template <typename ExpFn>
TROUPE_HD PpoTerm ppo_term(float logp, float old_logp, float adv, float clip_low, float clip_high,
                           float dual_clip, ExpFn exp_fn) {
  const float ratio = exp_fn(clampf(logp - old_logp, -kLogRatioClampPpo, kLogRatioClampPpo));
  const float pg1 = -adv * ratio;
  const float pg2 = -adv * clampf(ratio, 1.0f - clip_low, 1.0f + clip_high);
  // Selects, not branches, so that CPU loops vectorise.
  const bool clipped = pg2 > pg1;
  float loss = clipped ? pg2 : pg1;
  float grad = clipped ? 0.0f : pg1;
  const float cap = -adv * dual_clip;
  const bool capped = (dual_clip > 1.0f) & (adv < 0.0f) & (loss > cap);  // no short-circuit branches
  loss = capped ? cap : loss;
  grad = capped ? 0.0f : grad;
  return PpoTerm{loss, grad, clipped ? 1.0f : 0.0f};
}

// Per-token weight of the loss aggregation: valid tokens of a row with `row_count` of them, with
// `total` valid tokens and `nonempty` rows holding any.
TROUPE_HD double loss_weight(LossAggregation agg, std::int64_t row_count, std::int64_t total,
                             std::int64_t nonempty) {
  if (total == 0 || row_count == 0) return 0.0;
  if (agg == LossAggregation::kTokenMean) return 1.0 / double(total);
  if (agg == LossAggregation::kSeqMeanTokenMean) return 1.0 / (double(row_count) * nonempty);
  return 1.0 / double(nonempty);
}

// kInt8Row: the scale stored for a row whose largest magnitude is `amax`, and the multiplier used
// to quantise. amax 0 gives scale 0 and multiplier 0, so the row packs to zeros. Inputs must be
// finite (a NaN or inf makes its row's values unspecified).
TROUPE_HD float int8_scale(float amax) { return amax > 0.0f ? amax / 127.0f : 0.0f; }
TROUPE_HD float int8_inv_scale(float amax) { return amax > 0.0f ? 127.0f / amax : 0.0f; }

TROUPE_HD std::int8_t int8_quantise(float x, float inv_scale) {
  return std::int8_t(clampf(rintf(x * inv_scale), -127.0f, 127.0f));
}

}  // namespace troupe::kernels::detail
