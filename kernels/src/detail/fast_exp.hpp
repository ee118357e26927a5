#pragma once
// A branch-free expf the compiler vectorises inside `omp simd` loops (libm's expf is a call).
// Cephes' degree-5 polynomial on [-ln2/2, ln2/2] after range reduction by powers of two.
// Contract: for x in [-87, 88] the relative error is below 3e-7 (tests compare it with std::exp).
// x is clamped to [-87, 88] first: -inf maps to exp(-87) ~ 1.6e-38, not 0 (negligible against a
// softmax sum >= 1), +inf to ~1.65e38, not inf; NaN stays NaN.

#include <bit>
#include <cstdint>

namespace troupe::kernels::detail {

inline constexpr float kExpFloor = -87.0f;
inline constexpr float kExpCeil = 88.0f;

[[gnu::always_inline]] inline float fast_exp(float x) {
  x = x < kExpFloor ? kExpFloor : x;
  x = x > kExpCeil ? kExpCeil : x;
  // n = round(x / ln2) by the 1.5 * 2^23 trick (no SSE4.1 round instruction needed).
  const float kMagic = 12582912.0f;
  const float n = (x * 1.44269504088896341f + kMagic) - kMagic;
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  const std::int32_t e = (std::int32_t(n) + 127) << 23;
  return y * std::bit_cast<float>(e);
}

// The same as a function object, so templates that take an exponential inline it.
struct FastExp {
  [[gnu::always_inline]] float operator()(float x) const { return fast_exp(x); }
};

}  // namespace troupe::kernels::detail
