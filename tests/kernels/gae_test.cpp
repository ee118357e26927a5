#include "troupe/kernels/gae.hpp"

#include <doctest/doctest.h>

#include "reference.hpp"

namespace tk = troupe::kernels;
using namespace troupe::kernels::testing;

namespace {

constexpr double kTol = 1e-5;

// The textbook loop in fp64: the valid tokens of each row, gathered, then scanned back to front.
void reference(const std::vector<float>& r, const std::vector<float>& v, const std::vector<std::uint8_t>& m,
               std::int64_t rows, std::int64_t tokens, double gamma, double lambda, std::vector<double>& adv,
               std::vector<double>& ret) {
  adv.assign(r.size(), 0.0);
  ret.assign(r.size(), 0.0);
  for (std::int64_t row = 0; row < rows; ++row) {
    std::vector<std::int64_t> valid;
    for (std::int64_t t = 0; t < tokens; ++t) {
      if (m.empty() || m[std::size_t(row * tokens + t)]) valid.push_back(row * tokens + t);
    }
    double next_adv = 0.0;
    for (std::size_t k = valid.size(); k-- > 0;) {
      const auto i = std::size_t(valid[k]);
      const double next_v = k + 1 < valid.size() ? double(v[std::size_t(valid[k + 1])]) : 0.0;
      const double delta = double(r[i]) + gamma * next_v - double(v[i]);
      adv[i] = delta + gamma * lambda * next_adv;
      ret[i] = adv[i] + double(v[i]);
      next_adv = adv[i];
    }
  }
}

}  // namespace

TEST_CASE("gae matches a hand-computed response, and gamma = lambda = 1 gives the return less V") {
  const std::vector<float> r{0.0f, 0.0f, 1.0f}, v{0.5f, 0.6f, 0.7f};
  auto adv = poisoned(3), ret = poisoned(3);
  REQUIRE(tk::gae(r.data(), v.data(), nullptr, 1, 3, adv.data(), ret.data(), {0.9f, 0.8f}).ok());
  // delta_2 = 1 - 0.7; delta_1 = 0.9 * 0.7 - 0.6; delta_0 = 0.9 * 0.6 - 0.5; gamma * lambda = 0.72
  CHECK(close(adv[2], 0.3, kTol));
  CHECK(close(adv[1], 0.03 + 0.72 * 0.3, kTol));
  CHECK(close(adv[0], 0.04 + 0.72 * 0.246, kTol));
  CHECK(close(ret[2], 1.0, kTol));
  CHECK(close(ret[1], 0.246 + 0.6, kTol));
  CHECK(close(ret[0], 0.21712 + 0.5, kTol));
  REQUIRE(tk::gae(r.data(), v.data(), nullptr, 1, 3, adv.data(), ret.data(), {1.0f, 1.0f}).ok());
  for (int t = 0; t < 3; ++t) {
    CHECK(close(adv[std::size_t(t)], 1.0 - v[std::size_t(t)], kTol));   // sum of rewards ahead - V_t
    CHECK(close(ret[std::size_t(t)], 1.0, kTol));
  }
  REQUIRE(tk::gae(r.data(), v.data(), nullptr, 1, 3, adv.data(), ret.data(), {0.9f, 0.0f}).ok());
  CHECK(close(adv[1], 0.03, kTol));   // lambda 0: the one-step TD error
}

TEST_CASE("gae skips masked tokens: padding anywhere changes nothing, and masked outputs are 0") {
  // Row 0: left padding, row 1: interior padding, row 2: right padding; all the same 3 tokens.
  const std::vector<float> r{9, 9, 0, 0, 1, /**/ 0, 9, 0, 9, 1, /**/ 0, 0, 1, 9, 9};
  const std::vector<float> v{9, 9, .5f, .6f, .7f, /**/ .5f, 9, .6f, 9, .7f, /**/ .5f, .6f, .7f, 9, 9};
  const std::vector<std::uint8_t> m{0, 0, 1, 1, 1, /**/ 1, 0, 1, 0, 1, /**/ 1, 1, 1, 0, 0};
  auto adv = poisoned(15), ret = poisoned(15);
  REQUIRE(tk::gae(r.data(), v.data(), m.data(), 3, 5, adv.data(), ret.data(), {0.9f, 0.8f}).ok());
  const std::vector<std::size_t> firsts{2, 5, 10}, seconds{3, 7, 11}, thirds{4, 9, 12};
  for (int row = 0; row < 3; ++row) {
    CAPTURE(row);
    CHECK(close(adv[firsts[std::size_t(row)]], 0.21712, kTol));
    CHECK(close(adv[seconds[std::size_t(row)]], 0.246, kTol));
    CHECK(close(adv[thirds[std::size_t(row)]], 0.3, kTol));
  }
  for (std::size_t i = 0; i < m.size(); ++i) {
    if (!m[i]) {
      CHECK(adv[i] == 0.0f);
      CHECK(ret[i] == 0.0f);
    }
  }
}

TEST_CASE("gae matches an fp64 reference on random batches, threads or not") {
  for (auto [rows, tokens] : {std::pair<std::int64_t, std::int64_t>{1, 1}, {7, 33}, {64, 512}, {512, 300}}) {
    CAPTURE(rows);
    CAPTURE(tokens);
    const auto n = std::size_t(rows * tokens);
    const auto r = normal(n, 0.3f, 1), v = normal(n, 1.0f, 2);
    const auto m = bernoulli_mask(n, 0.8, 3);
    std::vector<double> want_adv, want_ret;
    reference(r, v, m, rows, tokens, 0.99, 0.95, want_adv, want_ret);
    auto adv = poisoned(n), ret = poisoned(n);
    REQUIRE(tk::gae(r.data(), v.data(), m.data(), rows, tokens, adv.data(), ret.data(), {0.99f, 0.95f}).ok());
    std::size_t bad = 0;
    for (std::size_t i = 0; i < n; ++i) {
      if (!close(adv[i], want_adv[i], kTol) || !close(ret[i], want_ret[i], kTol)) ++bad;
    }
    CHECK(bad == 0);
  }
}

TEST_CASE("gae refuses bad sizes, options and null pointers, and touches nothing") {
  const float x = 1.0f;
  float out = kNaN, ret = kNaN;
  CHECK(tk::gae(&x, &x, nullptr, -1, 1, &out, &ret).error().code == tk::KernelCode::BadArguments);
  CHECK(tk::gae(&x, &x, nullptr, 1, -1, &out, &ret).error().code == tk::KernelCode::BadArguments);
  CHECK(tk::gae(&x, &x, nullptr, 1, 1, &out, &ret, {1.5f, 0.9f}).error().code == tk::KernelCode::BadArguments);
  CHECK(tk::gae(&x, &x, nullptr, 1, 1, &out, &ret, {0.9f, -0.1f}).error().code == tk::KernelCode::BadArguments);
  CHECK(tk::gae(&x, &x, nullptr, 1, 1, &out, &ret, {kNaN, 0.9f}).error().code == tk::KernelCode::BadArguments);
  CHECK(tk::gae(nullptr, &x, nullptr, 1, 1, &out, &ret).error().code == tk::KernelCode::BadArguments);
  CHECK(tk::gae(&x, &x, nullptr, 1, 1, &out, nullptr).error().code == tk::KernelCode::BadArguments);
  CHECK(std::isnan(out));
  CHECK(std::isnan(ret));
  CHECK(tk::gae(nullptr, nullptr, nullptr, 0, 5, nullptr, nullptr).ok());   // nothing to do
}
