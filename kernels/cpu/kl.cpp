// CPU twin of kernel 3: an elementwise map, vectorised per estimator (the switch is hoisted).
#include <algorithm>

#include "detail/check.hpp"
#include "detail/fast_exp.hpp"
#include "detail/formulas.hpp"
#include "detail/parallel.hpp"
#include "detail/simd.hpp"
#include "troupe/kernels/kl.hpp"

namespace troupe::kernels {
namespace {

// Unmasked values first, then the mask applied over the same L1-sized block: two simple loops
// vectorise where one loop mixing byte and float lanes does not.
template <KlEstimator kEst>
[[gnu::always_inline]] inline void kl_range(const float* logp, const float* ref,
                                            const std::uint8_t* mask, std::int64_t begin,
                                            std::int64_t end, float clamp, float* kl) {
  constexpr std::int64_t kBlock = 1024;
  for (std::int64_t b = begin; b < end; b += kBlock) {
    const std::int64_t e = std::min(end, b + kBlock);
#pragma omp simd
    for (std::int64_t i = b; i < e; ++i) {
      kl[i] = detail::kl_term(logp[i], ref[i], kEst, clamp, detail::FastExp{});
    }
    if (!mask) continue;
#pragma omp simd
    for (std::int64_t i = b; i < e; ++i) kl[i] = mask[i] ? kl[i] : 0.0f;
  }
}

TROUPE_SIMD_CLONES
void kl_slice(const float* logp, const float* ref, const std::uint8_t* mask, std::int64_t begin,
              std::int64_t end, KlEstimator est, float clamp, float* kl) {
  switch (est) {
    case KlEstimator::kK1: return kl_range<KlEstimator::kK1>(logp, ref, mask, begin, end, clamp, kl);
    case KlEstimator::kK2: return kl_range<KlEstimator::kK2>(logp, ref, mask, begin, end, clamp, kl);
    case KlEstimator::kK3: return kl_range<KlEstimator::kK3>(logp, ref, mask, begin, end, clamp, kl);
  }
}

}  // namespace

Status kl_penalty(const float* logp, const float* ref_logp, const std::uint8_t* mask,
                  std::int64_t n, float* kl, const KlOptions& o) {
  TROUPE_RETURN_IF_ERROR(detail::check_kl(logp, ref_logp, n, kl, o));
  detail::parallel_for(n, 13, [&](std::int64_t b, std::int64_t e) {
    kl_slice(logp, ref_logp, mask, b, e, o.estimator, o.log_ratio_clamp, kl);
  });
  return {};
}

}  // namespace troupe::kernels
