// CPU twin of kernel 7: (batch, head) tiles are independent; each is a few small loops over its
// queries and keys, which the compiler vectorises along the head width.
#include <cmath>
#include <limits>
#include <vector>

#include "detail/check.hpp"
#include "detail/parallel.hpp"
#include "troupe/kernels/attention.hpp"

namespace troupe::kernels {
namespace {

inline float dot(const float* a, const float* b, std::int64_t n) {
  float s = 0;
#pragma omp simd reduction(+ : s)
  for (std::int64_t d = 0; d < n; ++d) s += a[d] * b[d];
  return s;
}

inline void axpy(float a, const float* x, float* y, std::int64_t n) {
#pragma omp simd
  for (std::int64_t d = 0; d < n; ++d) y[d] += a * x[d];
}

}  // namespace

Status attention_forward(const float* q, const float* k, const float* v, const std::uint8_t* key_mask,
                         const AttentionShape& s, float scale, float* probs, float* out) {
  TROUPE_RETURN_IF_ERROR(detail::check_attention(q, k, v, s, probs, out, "attention_forward"));
  const std::int64_t tq = s.queries, tk = s.keys, dim = s.dim, offset = tk - tq, rows = s.key_rows > 0 ? s.key_rows : tk;
  if (s.batch * s.heads * tq == 0) return {};
  detail::parallel_for(s.batch * s.heads, tq * tk * dim * 8, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t tile = begin; tile < end; ++tile) {
      const std::int64_t b = tile / s.heads;
      const std::uint8_t* mask = key_mask ? key_mask + b * tk : nullptr;
      const float* kt = k + tile * rows * dim;
      const float* vt = v + tile * rows * dim;
      for (std::int64_t i = 0; i < tq; ++i) {
        const float* qi = q + (tile * tq + i) * dim;
        float* p = probs + (tile * tq + i) * tk;
        float* o = out + (tile * tq + i) * dim;
        const std::int64_t pos = offset + i;
        float top = -std::numeric_limits<float>::infinity();
        for (std::int64_t j = 0; j < tk; ++j) {
          const bool allowed = j == pos || (j < pos && (mask == nullptr || mask[j] != 0));
          p[j] = allowed ? scale * dot(qi, kt + j * dim, dim) : -std::numeric_limits<float>::infinity();
          top = p[j] > top ? p[j] : top;
        }
        double sum = 0;
        for (std::int64_t j = 0; j < tk; ++j) {
          p[j] = p[j] == -std::numeric_limits<float>::infinity() ? 0.0f : std::exp(p[j] - top);   // a masked key
          sum += p[j];
        }
        const float inv = float(1.0 / sum);
        for (std::int64_t d = 0; d < dim; ++d) o[d] = 0;
        for (std::int64_t j = 0; j < tk; ++j) {
          p[j] *= inv;
          if (p[j] != 0) axpy(p[j], vt + j * dim, o, dim);
        }
      }
    }
  });
  return {};
}

Status attention_backward(const float* q, const float* k, const float* v, const float* probs, const float* d_out,
                          const AttentionShape& s, float scale, float* dq, float* dk, float* dv) {
  TROUPE_RETURN_IF_ERROR(detail::check_attention(q, k, v, s, probs, d_out, "attention_backward"));
  if (dq == nullptr || dk == nullptr || dv == nullptr) return detail::bad("attention_backward: null pointer");
  const std::int64_t tq = s.queries, tk = s.keys, dim = s.dim, rows = s.key_rows > 0 ? s.key_rows : tk;
  const std::int64_t tiles = s.batch * s.heads;
  for (std::int64_t e = 0; e < tiles * tk * dim; ++e) dk[e] = dv[e] = 0;
  if (tiles * tq == 0) return {};
  detail::parallel_for(tiles, tq * tk * dim * 16, [&](std::int64_t begin, std::int64_t end) {
    std::vector<float> dp(static_cast<std::size_t>(tk));
    for (std::int64_t tile = begin; tile < end; ++tile) {
      const float* kt = k + tile * rows * dim;
      const float* vt = v + tile * rows * dim;
      float* dkt = dk + tile * tk * dim;
      float* dvt = dv + tile * tk * dim;
      for (std::int64_t i = 0; i < tq; ++i) {
        const float* qi = q + (tile * tq + i) * dim;
        const float* p = probs + (tile * tq + i) * tk;
        const float* g = d_out + (tile * tq + i) * dim;
        float* dqi = dq + (tile * tq + i) * dim;
        double weighted = 0;
        for (std::int64_t j = 0; j < tk; ++j) {
          dp[std::size_t(j)] = p[j] != 0 ? dot(g, vt + j * dim, dim) : 0.0f;
          weighted += double(p[j]) * dp[std::size_t(j)];
        }
        for (std::int64_t d = 0; d < dim; ++d) dqi[d] = 0;
        for (std::int64_t j = 0; j < tk; ++j) {
          if (p[j] == 0) continue;
          axpy(p[j], g, dvt + j * dim, dim);
          const float ds = scale * p[j] * float(dp[std::size_t(j)] - weighted);
          axpy(ds, kt + j * dim, dqi, dim);
          axpy(ds, qi, dkt + j * dim, dim);
        }
      }
    }
  });
  return {};
}

}  // namespace troupe::kernels
