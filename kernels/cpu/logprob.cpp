// CPU twin of kernel 1: one pass over each row in L1-sized chunks. Per chunk a max pass then an
// exp pass (both vectorised; the chunk is in L1 for the second), folded into per-row running
// (max, sum of exp, sum of exp * shifted logit) in fp64, so DRAM sees each logit once.
#include <cmath>
#include <limits>

#include "detail/check.hpp"
#include "detail/fast_exp.hpp"
#include "detail/parallel.hpp"
#include "detail/simd.hpp"
#include "troupe/kernels/logprob.hpp"

namespace troupe::kernels {
namespace {

constexpr std::int64_t kChunk = 2048;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

[[gnu::always_inline]] inline float load(const float* p, std::int64_t i) { return p[i]; }
[[gnu::always_inline]] inline float load(const bf16* p, std::int64_t i) { return to_float(p[i]); }

// Softmax statistics of one row of z = x * inv_t: max m, s = sum e^(z-m), t = sum e^(z-m) (z-m).
struct RowStats {
  float m = kNegInf;
  double s = 0.0;
  double t = 0.0;
};

template <typename T>
[[gnu::always_inline]] inline void add_chunk(const T* x, std::int64_t len, float inv_t, RowStats& r) {
  float cm = kNegInf;
#pragma omp simd reduction(max : cm)
  for (std::int64_t i = 0; i < len; ++i) cm = std::max(cm, load(x, i) * inv_t);
  if (cm > r.m) {  // rescale what was summed against the old max
    if (r.s > 0.0) {
      const double shift = double(r.m) - double(cm);
      const double scale = std::exp(shift);
      r.t = scale * (r.t + shift * r.s);
      r.s *= scale;
    }
    r.m = cm;
  }
  if (r.m == kNegInf) return;  // only -inf so far
  const float m = r.m;
  float cs = 0.0f, ct = 0.0f;
#pragma omp simd reduction(+ : cs, ct)
  for (std::int64_t i = 0; i < len; ++i) {
    float d = load(x, i) * inv_t - m;
    d = d < detail::kExpFloor ? detail::kExpFloor : d;
    const float e = detail::fast_exp(d);
    cs += e;
    ct += d * e;
  }
  r.s += cs;
  r.t += ct;
}

// bf16 chunks are widened into an L1 buffer first: one simple conversion loop, then the fp32 path
// (the compiler vectorises the two separately far better than the fused loop).
[[gnu::always_inline]] inline void add_chunk(const bf16* x, std::int64_t len, float inv_t, RowStats& r) {
  alignas(64) float buf[kChunk];
#pragma omp simd
  for (std::int64_t i = 0; i < len; ++i) buf[i] = to_float(x[i]);
  add_chunk<float>(buf, len, inv_t, r);
}

template <typename T>
[[gnu::always_inline]] inline void rows_impl(const T* logits, std::int64_t begin, std::int64_t end,
                                             std::int64_t vocab, std::int64_t stride, float inv_t,
                                             const std::int64_t* tokens, float* logprob,
                                             float* entropy) {
  for (std::int64_t row = begin; row < end; ++row) {
    const T* x = logits + row * stride;
    RowStats r;
    for (std::int64_t c = 0; c < vocab; c += kChunk) add_chunk(x + c, std::min(kChunk, vocab - c), inv_t, r);
    const bool defined = r.m != kNegInf;
    const double log_s = std::log(r.s);
    const std::int64_t tok = tokens[row];
    const bool in_range = tok >= 0 && tok < vocab;
    logprob[row] = defined && in_range ? float(double(load(x, tok) * inv_t) - r.m - log_s) : kNaN;
    if (entropy) entropy[row] = defined ? float(log_s - r.t / r.s) : kNaN;
  }
}

TROUPE_SIMD_CLONES
void rows_f32(const float* logits, std::int64_t begin, std::int64_t end, std::int64_t vocab,
              std::int64_t stride, float inv_t, const std::int64_t* tokens, float* logprob,
              float* entropy) {
  rows_impl(logits, begin, end, vocab, stride, inv_t, tokens, logprob, entropy);
}

TROUPE_SIMD_CLONES
void rows_bf16(const bf16* logits, std::int64_t begin, std::int64_t end, std::int64_t vocab,
               std::int64_t stride, float inv_t, const std::int64_t* tokens, float* logprob,
               float* entropy) {
  rows_impl(logits, begin, end, vocab, stride, inv_t, tokens, logprob, entropy);
}

template <typename T, typename RowsFn>
Status run(const T* logits, std::int64_t rows, std::int64_t vocab, const std::int64_t* tokens,
           float* logprob, float* entropy, const LogprobOptions& o, RowsFn rows_fn) {
  TROUPE_RETURN_IF_ERROR(detail::check_logprob(logits, rows, vocab, tokens, logprob, o));
  const std::int64_t stride = o.row_stride ? o.row_stride : vocab;
  const float inv_t = 1.0f / o.temperature;
  detail::parallel_for(rows, vocab * std::int64_t(sizeof(T)), [&](std::int64_t b, std::int64_t e) {
    rows_fn(logits, b, e, vocab, stride, inv_t, tokens, logprob, entropy);
  });
  return {};
}

}  // namespace

Status logprob_gather(const float* logits, std::int64_t rows, std::int64_t vocab,
                      const std::int64_t* tokens, float* logprob, float* entropy,
                      const LogprobOptions& options) {
  return run(logits, rows, vocab, tokens, logprob, entropy, options, rows_f32);
}

Status logprob_gather(const bf16* logits, std::int64_t rows, std::int64_t vocab,
                      const std::int64_t* tokens, float* logprob, float* entropy,
                      const LogprobOptions& options) {
  return run(logits, rows, vocab, tokens, logprob, entropy, options, rows_bf16);
}

}  // namespace troupe::kernels
