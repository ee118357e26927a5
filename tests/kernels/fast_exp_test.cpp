#include "detail/fast_exp.hpp"

#include <cmath>

#include <doctest/doctest.h>

#include "reference.hpp"

using troupe::kernels::detail::fast_exp;

TEST_CASE("fast_exp is within 3e-7 relative of exp over [-87, 88]") {
  double worst = 0.0;
  for (int i = 0; i <= 2000000; ++i) {
    const float x = -87.0f + 175.0f * float(i) / 2000000.0f;
    const double want = std::exp(double(x));
    worst = std::max(worst, std::fabs(fast_exp(x) - want) / want);
  }
  CHECK(worst < 3e-7);
}

TEST_CASE("fast_exp clamps infinities and keeps NaN") {
  using troupe::kernels::testing::kInf;
  CHECK(fast_exp(-kInf) > 0.0f);
  CHECK(fast_exp(-kInf) < 2e-38f);
  CHECK(std::isfinite(fast_exp(kInf)));
  CHECK(std::isnan(fast_exp(std::nanf(""))));
  CHECK(fast_exp(0.0f) == 1.0f);
}
