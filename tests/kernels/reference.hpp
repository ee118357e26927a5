#pragma once
// Helpers for the kernels tests: seeded random inputs, NaN-poisoned outputs (an element a kernel
// forgets to write fails the comparison), and the relative-plus-absolute closeness check.
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include <doctest/doctest.h>

namespace troupe::kernels::testing {

inline constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
inline constexpr float kInf = std::numeric_limits<float>::infinity();

inline std::vector<float> poisoned(std::size_t n) { return std::vector<float>(n, kNaN); }

inline std::vector<float> uniform(std::size_t n, float lo, float hi, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

inline std::vector<float> normal(std::size_t n, float sigma, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

inline std::vector<std::uint8_t> bernoulli_mask(std::size_t n, double p_valid, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::bernoulli_distribution d(p_valid);
  std::vector<std::uint8_t> m(n);
  for (auto& b : m) b = d(rng) ? 1 : 0;
  return m;
}

// |actual - expected| <= tol * (1 + |expected|); NaN matches NaN only, inf matches the same inf.
inline bool close(double actual, double expected, double tol) {
  if (std::isnan(expected)) return std::isnan(actual);
  if (std::isinf(expected)) return actual == expected;
  return std::fabs(actual - expected) <= tol * (1.0 + std::fabs(expected));
}

// Checks every element and reports the first mismatch with its index.
inline void check_all_close(const std::vector<float>& actual, const std::vector<double>& expected,
                            double tol) {
  REQUIRE(actual.size() == expected.size());
  for (std::size_t i = 0; i < actual.size(); ++i) {
    if (!close(actual[i], expected[i], tol)) {
      INFO("index " << i << ": got " << actual[i] << ", want " << expected[i]);
      CHECK(close(actual[i], expected[i], tol));
      return;
    }
  }
}

}  // namespace troupe::kernels::testing
