#include "troupe/kernels/policy_loss.hpp"

#include <algorithm>
#include <cmath>

#include <doctest/doctest.h>

#include "reference.hpp"

namespace tk = troupe::kernels;
using namespace troupe::kernels::testing;

namespace {

constexpr double kTol = 1e-5;

struct Inputs {
  std::int64_t rows, tokens;
  std::vector<float> logp, old_logp, adv;
  std::vector<std::uint8_t> mask;
};

Inputs random_inputs(std::int64_t rows, std::int64_t tokens, std::uint64_t seed) {
  const std::size_t n = std::size_t(rows * tokens);
  Inputs in{rows, tokens, uniform(n, -6.0f, 0.0f, seed), {}, normal(n, 1.0f, seed + 1),
            bernoulli_mask(n, 0.8, seed + 2)};
  in.old_logp = in.logp;
  const auto drift = normal(n, 0.3f, seed + 3);
  for (std::size_t i = 0; i < n; ++i) in.old_logp[i] += drift[i];
  return in;
}

struct Expected {
  double loss = 0.0, clip_fraction = 0.0;
  std::vector<double> grad;
};

// Straight from the formulas in policy_loss.hpp, in fp64.
Expected reference(const Inputs& in, const tk::PolicyLossOptions& o) {
  Expected e;
  e.grad.assign(in.logp.size(), 0.0);
  std::vector<std::int64_t> count(std::size_t(in.rows), 0);
  std::int64_t total = 0, nonempty = 0, clipped = 0;
  for (std::int64_t r = 0; r < in.rows; ++r) {
    for (std::int64_t t = 0; t < in.tokens; ++t) count[std::size_t(r)] += in.mask[std::size_t(r * in.tokens + t)];
    total += count[std::size_t(r)];
    nonempty += count[std::size_t(r)] > 0;
  }
  for (std::int64_t r = 0; r < in.rows; ++r) {
    const double n_s = double(count[std::size_t(r)]);
    for (std::int64_t t = 0; t < in.tokens; ++t) {
      const std::size_t i = std::size_t(r * in.tokens + t);
      if (!in.mask[i]) continue;
      const double w = o.aggregation == tk::LossAggregation::kTokenMean ? 1.0 / double(total)
                       : o.aggregation == tk::LossAggregation::kSeqMeanTokenMean
                           ? 1.0 / (n_s * double(nonempty))
                           : 1.0 / double(nonempty);
      const double a = in.adv[i];
      const double ratio = std::exp(std::clamp(double(in.logp[i]) - in.old_logp[i], -20.0, 20.0));
      const double pg1 = -a * ratio;
      const double pg2 = -a * std::clamp(ratio, 1.0 - o.clip_low, 1.0 + o.clip_high);
      double l = std::max(pg1, pg2), g = pg2 > pg1 ? 0.0 : -a * ratio;
      clipped += pg2 > pg1;
      if (o.dual_clip > 1.0f && a < 0.0 && l > -a * o.dual_clip) l = -a * o.dual_clip, g = 0.0;
      e.loss += w * l;
      e.grad[i] = w * g;
    }
  }
  e.clip_fraction = total ? double(clipped) / double(total) : 0.0;
  return e;
}

void check(const Inputs& in, const tk::PolicyLossOptions& o) {
  auto grad = poisoned(in.logp.size());
  float loss = kNaN, clip = kNaN;
  REQUIRE(tk::policy_loss(in.logp.data(), in.old_logp.data(), in.adv.data(), in.mask.data(), in.rows,
                          in.tokens, &loss, grad.data(), &clip, o).ok());
  const Expected e = reference(in, o);
  CHECK(close(loss, e.loss, kTol));
  CHECK(close(clip, e.clip_fraction, kTol));
  CHECK(e.clip_fraction > 0.0);  // the inputs do exercise clipping
  check_all_close(grad, e.grad, kTol);
}

}  // namespace

TEST_CASE("the clipped loss and its gradient match fp64 for every aggregation") {
  auto in = random_inputs(33, 257, 1);
  for (std::int64_t t = 0; t < in.tokens; ++t) in.mask[std::size_t(5 * in.tokens + t)] = 0;  // an empty row
  for (auto agg : {tk::LossAggregation::kTokenMean, tk::LossAggregation::kSeqMeanTokenMean,
                   tk::LossAggregation::kSeqMeanTokenSum}) {
    CAPTURE(int(agg));
    check(in, {0.2f, 0.2f, 0.0f, agg});
  }
}

TEST_CASE("clip-higher and dual-clip match fp64") {
  const auto in = random_inputs(16, 1000, 2);
  check(in, {0.2f, 0.28f, 0.0f, tk::LossAggregation::kTokenMean});
  check(in, {0.2f, 0.2f, 3.0f, tk::LossAggregation::kSeqMeanTokenMean});
}

TEST_CASE("a large batch forks threads and still matches fp64") {
  check(random_inputs(64, 4096, 3), {});
}

TEST_CASE("the gradient matches a central finite difference of the loss") {
  auto in = random_inputs(4, 50, 4);
  std::vector<float> grad(in.logp.size());
  float loss = 0.0f;
  REQUIRE(tk::policy_loss(in.logp.data(), in.old_logp.data(), in.adv.data(), in.mask.data(), 4, 50,
                          &loss, grad.data()).ok());
  for (std::size_t i : {0u, 17u, 63u, 199u}) {
    auto at = [&](double delta) {
      Inputs moved = in;
      moved.logp[i] = float(in.logp[i] + delta);
      return reference(moved, {}).loss;
    };
    const double h = 1e-3;
    CHECK(close(grad[i], (at(h) - at(-h)) / (2 * h), 1e-3));
  }
}

TEST_CASE("with every token masked the loss, gradient and clip fraction are 0") {
  auto in = random_inputs(3, 10, 5);
  std::fill(in.mask.begin(), in.mask.end(), 0);
  in.logp[0] = -kInf;  // masked garbage must not leak
  for (auto agg : {tk::LossAggregation::kTokenMean, tk::LossAggregation::kSeqMeanTokenMean}) {
    auto grad = poisoned(in.logp.size());
    float loss = kNaN, clip = kNaN;
    REQUIRE(tk::policy_loss(in.logp.data(), in.old_logp.data(), in.adv.data(), in.mask.data(), 3, 10,
                            &loss, grad.data(), &clip, {0.2f, 0.2f, 0.0f, agg}).ok());
    CHECK(loss == 0.0f);
    CHECK(clip == 0.0f);
    for (float g : grad) CHECK(g == 0.0f);
  }
}

TEST_CASE("a null mask means every token is valid") {
  auto in = random_inputs(4, 30, 6);
  auto grad = poisoned(in.logp.size());
  float loss = kNaN;
  REQUIRE(tk::policy_loss(in.logp.data(), in.old_logp.data(), in.adv.data(), nullptr, 4, 30, &loss,
                          grad.data()).ok());
  std::fill(in.mask.begin(), in.mask.end(), 1);
  const Expected e = reference(in, {});
  CHECK(close(loss, e.loss, kTol));
  check_all_close(grad, e.grad, kTol);
}

TEST_CASE("policy_loss rejects bad clip ranges and a null loss") {
  const float x = 0.0f;
  float g = kNaN, loss = kNaN;
  CHECK(tk::policy_loss(&x, &x, &x, nullptr, 1, 1, nullptr, &g).error().code == tk::KernelCode::BadArguments);
  CHECK(tk::policy_loss(&x, &x, &x, nullptr, 1, 1, &loss, &g, nullptr, {1.5f, 0.2f}).error().code ==
        tk::KernelCode::BadArguments);
  CHECK(tk::policy_loss(&x, &x, &x, nullptr, 1, 1, &loss, &g, nullptr, {0.2f, 0.2f, 0.5f}).error().code ==
        tk::KernelCode::BadArguments);
  CHECK(std::isnan(g));
}
