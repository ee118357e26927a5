#include "troupe/kernels/kl.hpp"

#include <algorithm>
#include <cmath>

#include <doctest/doctest.h>

#include "reference.hpp"

namespace tk = troupe::kernels;
using namespace troupe::kernels::testing;

namespace {

constexpr double kTol = 1e-5;

double reference(double lp, double ref, tk::KlEstimator est, double clamp) {
  switch (est) {
    case tk::KlEstimator::kK1: return lp - ref;
    case tk::KlEstimator::kK2: return 0.5 * (lp - ref) * (lp - ref);
    case tk::KlEstimator::kK3: {
      double lr = ref - lp;
      if (clamp > 0) lr = std::clamp(lr, -clamp, clamp);
      return std::exp(lr) - lr - 1.0;
    }
  }
  return NAN;
}

void check(tk::KlEstimator est, std::size_t n, bool masked, float clamp, std::uint64_t seed) {
  const auto lp = uniform(n, -8.0f, 0.0f, seed);
  auto ref = lp;
  const auto noise = normal(n, 0.5f, seed + 1);
  for (std::size_t i = 0; i < n; ++i) ref[i] = std::min(0.0f, lp[i] + noise[i]);
  const auto mask = bernoulli_mask(n, 0.7, seed + 2);
  auto kl = poisoned(n);
  REQUIRE(tk::kl_penalty(lp.data(), ref.data(), masked ? mask.data() : nullptr, std::int64_t(n),
                         kl.data(), {est, clamp}).ok());
  std::vector<double> want(n);
  for (std::size_t i = 0; i < n; ++i) {
    want[i] = !masked || mask[i] ? reference(lp[i], ref[i], est, clamp) : 0.0;
  }
  check_all_close(kl, want, kTol);
}

}  // namespace

TEST_CASE("k1, k2 and k3 match fp64 formulas on random logprobs, masked and not") {
  for (auto est : {tk::KlEstimator::kK1, tk::KlEstimator::kK2, tk::KlEstimator::kK3}) {
    CAPTURE(int(est));
    check(est, 1001, true, 20.0f, 1);
    check(est, 1001, false, 20.0f, 2);
    check(est, 300000, true, 20.0f, 3);  // enough to fork
  }
}

TEST_CASE("k3 clamps the log ratio so that it cannot overflow") {
  const std::vector<float> lp{-100.0f, -1.0f}, ref{-1.0f, -100.0f};
  auto kl = poisoned(2);
  REQUIRE(tk::kl_penalty(lp.data(), ref.data(), nullptr, 2, kl.data(), {tk::KlEstimator::kK3, 20.0f}).ok());
  CHECK(close(kl[0], std::exp(20.0) - 21.0, kTol));
  CHECK(close(kl[1], std::exp(-20.0) + 19.0, kTol));
}

TEST_CASE("a fully masked input gives all zeros even where the logprobs are -inf") {
  const std::vector<float> lp{-kInf, -kInf, -1.0f}, ref{-kInf, -2.0f, -kInf};
  const std::vector<std::uint8_t> mask{0, 0, 0};
  for (auto est : {tk::KlEstimator::kK1, tk::KlEstimator::kK2, tk::KlEstimator::kK3}) {
    auto kl = poisoned(3);
    REQUIRE(tk::kl_penalty(lp.data(), ref.data(), mask.data(), 3, kl.data(), {est, 20.0f}).ok());
    for (float v : kl) CHECK(v == 0.0f);
  }
}

TEST_CASE("kl_penalty rejects null pointers and a negative clamp") {
  const float x = 0.0f;
  float kl = kNaN;
  CHECK(tk::kl_penalty(&x, nullptr, nullptr, 1, &kl).error().code == tk::KernelCode::BadArguments);
  CHECK(tk::kl_penalty(&x, &x, nullptr, 1, &kl, {tk::KlEstimator::kK3, -1.0f}).error().code ==
        tk::KernelCode::BadArguments);
  CHECK(std::isnan(kl));
}
