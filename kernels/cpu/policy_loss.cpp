// CPU twin of kernel 4. Two passes: count valid tokens per row (bytes only), then one fused pass
// that writes the weighted gradient and sums each row's loss; row sums are added in row order, so
// the result does not depend on the thread count.
#include <algorithm>
#include <vector>

#include "detail/check.hpp"
#include "detail/fast_exp.hpp"
#include "detail/formulas.hpp"
#include "detail/parallel.hpp"
#include "detail/simd.hpp"
#include "troupe/kernels/policy_loss.hpp"

namespace troupe::kernels {
namespace {

struct RowSums {
  double loss = 0.0;      // sum of w_t l_t over the row's valid tokens
  std::int64_t clipped = 0;
};

// One row: grad for every token (0 where masked), and the row's weighted loss and clip count.
// Per L1 block a pure map (token terms into small buffers) and then plain sums: the compiler
// vectorises these two loops, where one loop with reductions over the fused terms stayed scalar.
template <bool kMasked>
[[gnu::always_inline]] inline RowSums row_pass_impl(const float* logp, const float* old_logp,
                                                    const float* adv, const std::uint8_t* mask,
                                                    std::int64_t n, float weight, float clip_low,
                                                    float clip_high, float dual_clip, float* grad) {
  constexpr std::int64_t kBlock = 1024;
  alignas(64) float loss_buf[kBlock];
  alignas(64) float clip_buf[kBlock];
  alignas(64) float valid_buf[kBlock];  // the mask as floats: the main loop then has one lane width
  double loss = 0.0;
  double clipped = 0.0;
  for (std::int64_t b = 0; b < n; b += kBlock) {
    const std::int64_t len = std::min(kBlock, n - b);
    if (kMasked) {
      for (std::int64_t i = 0; i < len; ++i) valid_buf[i] = mask[b + i] != 0 ? 1.0f : 0.0f;
    }
#pragma omp simd
    for (std::int64_t i = 0; i < len; ++i) {
      const detail::PpoTerm t = detail::ppo_term(logp[b + i], old_logp[b + i], adv[b + i], clip_low,
                                                 clip_high, dual_clip, detail::FastExp{});
      const bool valid = !kMasked || valid_buf[i] != 0.0f;
      grad[b + i] = valid ? weight * t.grad : 0.0f;
      loss_buf[i] = valid ? t.loss : 0.0f;
      clip_buf[i] = valid ? t.clipped : 0.0f;
    }
    float ls = 0.0f, cs = 0.0f;  // fp32 within a block, fp64 across blocks
#pragma omp simd reduction(+ : ls, cs)
    for (std::int64_t i = 0; i < len; ++i) ls += loss_buf[i], cs += clip_buf[i];
    loss += ls;
    clipped += cs;
  }
  return {loss * weight, std::int64_t(clipped)};
}

TROUPE_SIMD_CLONES
RowSums row_pass(const float* logp, const float* old_logp, const float* adv,
                 const std::uint8_t* mask, std::int64_t n, float weight, float clip_low,
                 float clip_high, float dual_clip, float* grad) {
  if (mask) return row_pass_impl<true>(logp, old_logp, adv, mask, n, weight, clip_low, clip_high, dual_clip, grad);
  return row_pass_impl<false>(logp, old_logp, adv, mask, n, weight, clip_low, clip_high, dual_clip, grad);
}

std::int64_t count_valid(const std::uint8_t* mask, std::int64_t n) {
  if (!mask) return n;
  std::int64_t c = 0;
#pragma omp simd reduction(+ : c)
  for (std::int64_t i = 0; i < n; ++i) c += mask[i] != 0;
  return c;
}

}  // namespace

Status policy_loss(const float* logp, const float* old_logp, const float* advantages,
                   const std::uint8_t* mask, std::int64_t rows, std::int64_t tokens, float* loss,
                   float* grad_logp, float* clip_fraction, const PolicyLossOptions& o) {
  TROUPE_RETURN_IF_ERROR(detail::check_policy_loss(logp, old_logp, advantages, rows,
                                                           tokens, loss, grad_logp, o));
  if (tokens == 0) rows = 0;  // nothing to read or write but the scalars
  std::vector<std::int64_t> counts(static_cast<std::size_t>(rows));
  std::int64_t total = 0, nonempty = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    counts[std::size_t(r)] = count_valid(mask ? mask + r * tokens : nullptr, tokens);
    total += counts[std::size_t(r)];
    nonempty += counts[std::size_t(r)] > 0;
  }
  std::vector<RowSums> sums(static_cast<std::size_t>(rows));
  detail::parallel_for(rows, tokens * 17, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t r = begin; r < end; ++r) {
      const std::size_t off = std::size_t(r * tokens);
      const float w = float(detail::loss_weight(o.aggregation, counts[std::size_t(r)], total, nonempty));
      sums[std::size_t(r)] = row_pass(logp + off, old_logp + off, advantages + off,
                                      mask ? mask + off : nullptr, tokens, w, o.clip_low,
                                      o.clip_high, o.dual_clip, grad_logp + off);
    }
  });
  double total_loss = 0.0;
  std::int64_t clipped = 0;
  for (const RowSums& s : sums) total_loss += s.loss, clipped += s.clipped;
  *loss = float(total_loss);
  if (clip_fraction) *clip_fraction = total > 0 ? float(double(clipped) / double(total)) : 0.0f;
  return {};
}

}  // namespace troupe::kernels
