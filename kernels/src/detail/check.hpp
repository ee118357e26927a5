#pragma once
// Argument checks shared by the CPU twins and the CUDA entry points, so both reject the same calls.

#include <cstdint>
#include <string>

#include "troupe/kernels/advantage.hpp"
#include "troupe/kernels/attention.hpp"
#include "troupe/kernels/gae.hpp"
#include "troupe/kernels/kl.hpp"
#include "troupe/kernels/logprob.hpp"
#include "troupe/kernels/policy_loss.hpp"

namespace troupe::kernels::detail {

inline Status bad(std::string what) { return {KernelCode::BadArguments, std::move(what)}; }

inline Status check_logprob(const void* logits, std::int64_t rows, std::int64_t vocab,
                            const std::int64_t* tokens, const float* logprob,
                            const LogprobOptions& o) {
  if (rows < 0 || vocab < 1) return bad("logprob_gather: need rows >= 0 and vocab >= 1");
  if (o.row_stride != 0 && o.row_stride < vocab) return bad("logprob_gather: row_stride < vocab");
  if (!(o.temperature > 0.0f)) return bad("logprob_gather: temperature must be > 0");
  if (rows > 0 && (!logits || !tokens || !logprob)) return bad("logprob_gather: null pointer");
  return {};
}

inline Status check_advantages(const float* scores, std::int64_t groups, std::int64_t group_size,
                               const float* advantages, const AdvantageOptions& o) {
  if (groups < 0 || group_size < 1) return bad("group_advantages: need groups >= 0, G >= 1");
  if (!(o.epsilon >= 0.0f)) return bad("group_advantages: epsilon must be >= 0");
  if (groups > 0 && (!scores || !advantages)) return bad("group_advantages: null pointer");
  return {};
}

inline Status check_attention(const float* q, const float* k, const float* v, const AttentionShape& s, const float* a,
                              const float* b, const char* who) {
  const std::string name = who;
  if (s.batch < 0 || s.heads < 0 || s.queries < 0 || s.dim < 1) return bad(name + ": need batch, heads, queries >= 0 and dim >= 1");
  if (s.keys < s.queries) return bad(name + ": keys must be >= queries (the queries are the last positions)");
  if (s.key_rows != 0 && s.key_rows < s.keys) return bad(name + ": key_rows must be 0 or >= keys");
  if (s.batch * s.heads * s.keys > 0 && (!q || !k || !v || !a || !b)) return bad(name + ": null pointer");
  return {};
}

inline Status check_gae(const float* rewards, const float* values, std::int64_t rows, std::int64_t tokens,
                        const float* advantages, const float* returns, const GaeOptions& o) {
  if (rows < 0 || tokens < 0) return bad("gae: negative size");
  if (!(o.gamma >= 0.0f && o.gamma <= 1.0f)) return bad("gae: gamma must be in [0, 1]");
  if (!(o.lambda >= 0.0f && o.lambda <= 1.0f)) return bad("gae: lambda must be in [0, 1]");
  if (rows > 0 && tokens > 0 && (!rewards || !values || !advantages || !returns)) return bad("gae: null pointer");
  return {};
}

inline Status check_kl(const float* logp, const float* ref, std::int64_t n, const float* kl,
                       const KlOptions& o) {
  if (n < 0) return bad("kl_penalty: n < 0");
  if (o.estimator > KlEstimator::kK3) return bad("kl_penalty: unknown estimator");
  if (!(o.log_ratio_clamp >= 0.0f)) return bad("kl_penalty: log_ratio_clamp must be >= 0");
  if (n > 0 && (!logp || !ref || !kl)) return bad("kl_penalty: null pointer");
  return {};
}

inline Status check_policy_loss(const float* logp, const float* old_logp, const float* adv,
                                std::int64_t rows, std::int64_t tokens, const float* loss,
                                const float* grad, const PolicyLossOptions& o) {
  if (rows < 0 || tokens < 0) return bad("policy_loss: negative size");
  if (!(o.clip_low >= 0.0f && o.clip_low < 1.0f) || !(o.clip_high >= 0.0f))
    return bad("policy_loss: need 0 <= clip_low < 1 and clip_high >= 0");
  if (o.dual_clip != 0.0f && !(o.dual_clip > 1.0f)) return bad("policy_loss: dual_clip must be 0 or > 1");
  if (o.aggregation > LossAggregation::kSeqMeanTokenSum) return bad("policy_loss: unknown aggregation");
  if (!loss) return bad("policy_loss: null loss");
  if (rows * tokens > 0 && (!logp || !old_logp || !adv || !grad))
    return bad("policy_loss: null pointer");
  return {};
}

}  // namespace troupe::kernels::detail
