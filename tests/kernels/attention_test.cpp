#include "troupe/kernels/attention.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <vector>

namespace tk = troupe::kernels;

namespace {

struct Case {
  tk::AttentionShape shape;
  std::vector<float> q, k, v;
  std::vector<std::uint8_t> mask;   // [B, Tk]
};

Case random_case(tk::AttentionShape s, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  Case c{s, {}, {}, {}, {}};
  const auto qn = std::size_t(s.batch * s.heads * s.queries * s.dim), kn = std::size_t(s.batch * s.heads * s.keys * s.dim);
  for (std::size_t i = 0; i < qn; ++i) c.q.push_back(n(rng));
  for (std::size_t i = 0; i < kn; ++i) { c.k.push_back(n(rng)); c.v.push_back(n(rng)); }
  for (std::int64_t b = 0; b < s.batch; ++b) {
    for (std::int64_t j = 0; j < s.keys; ++j) c.mask.push_back(std::uint8_t(j >= b));   // row b: b left-padding keys
  }
  return c;
}

// The textbook formula in fp64: out = softmax(scale * q k^T, masked) v, and L = sum(out * g).
std::vector<double> reference(const Case& c, const std::vector<double>& q, const std::vector<double>& k,
                              const std::vector<double>& v, double scale) {
  const auto& s = c.shape;
  std::vector<double> out(std::size_t(s.batch * s.heads * s.queries * s.dim), 0.0);
  for (std::int64_t b = 0; b < s.batch; ++b) {
    for (std::int64_t h = 0; h < s.heads; ++h) {
      const std::int64_t tile = b * s.heads + h;
      for (std::int64_t i = 0; i < s.queries; ++i) {
        const std::int64_t pos = s.keys - s.queries + i;
        std::vector<double> w(std::size_t(s.keys), 0.0);
        double top = -INFINITY, sum = 0;
        for (std::int64_t j = 0; j < s.keys; ++j) {
          if (!(j == pos || (j < pos && c.mask[std::size_t(b * s.keys + j)]))) { w[std::size_t(j)] = -INFINITY; continue; }
          double d = 0;
          for (std::int64_t x = 0; x < s.dim; ++x)
            d += q[std::size_t((tile * s.queries + i) * s.dim + x)] * k[std::size_t((tile * s.keys + j) * s.dim + x)];
          w[std::size_t(j)] = scale * d;
          top = std::max(top, scale * d);
        }
        for (auto& x : w) { x = std::isinf(x) ? 0.0 : std::exp(x - top); sum += x; }
        for (std::int64_t j = 0; j < s.keys; ++j) {
          for (std::int64_t x = 0; x < s.dim; ++x)
            out[std::size_t((tile * s.queries + i) * s.dim + x)] += w[std::size_t(j)] / sum * v[std::size_t((tile * s.keys + j) * s.dim + x)];
        }
      }
    }
  }
  return out;
}

std::vector<double> wide(const std::vector<float>& x) { return {x.begin(), x.end()}; }

}  // namespace

TEST_CASE("fused attention: the forward matches the fp64 formula, causal and key-masked, at every offset") {
  for (auto shape : {tk::AttentionShape{3, 2, 5, 5, 4}, tk::AttentionShape{2, 3, 1, 6, 8}, tk::AttentionShape{2, 2, 3, 7, 16}}) {
    const Case c = random_case(shape, 7);
    const float scale = 1.0f / std::sqrt(float(shape.dim));
    std::vector<float> probs(std::size_t(shape.batch * shape.heads * shape.queries * shape.keys)), out(c.q.size());
    REQUIRE(tk::attention_forward(c.q.data(), c.k.data(), c.v.data(), c.mask.data(), shape, scale, probs.data(), out.data()).ok());
    const auto want = reference(c, wide(c.q), wide(c.k), wide(c.v), scale);
    for (std::size_t i = 0; i < out.size(); ++i) CHECK(out[i] == doctest::Approx(want[i]).epsilon(1e-5).scale(1.0));
    // Each row of probabilities sums to 1, and a masked key gets exactly 0.
    for (std::int64_t r = 0; r < shape.batch * shape.heads * shape.queries; ++r) {
      double sum = 0;
      for (std::int64_t j = 0; j < shape.keys; ++j) sum += probs[std::size_t(r * shape.keys + j)];
      CHECK(sum == doctest::Approx(1.0).epsilon(1e-6));
      const std::int64_t b = r / (shape.heads * shape.queries), i = r % shape.queries;
      const std::int64_t pos = shape.keys - shape.queries + i;
      for (std::int64_t j = pos + 1; j < shape.keys; ++j) CHECK(probs[std::size_t(r * shape.keys + j)] == 0.0f);
      for (std::int64_t j = 0; j < std::min(b, pos); ++j) CHECK(probs[std::size_t(r * shape.keys + j)] == 0.0f);
    }
  }
}

TEST_CASE("fused attention: the backward matches central differences of the fp64 formula") {
  const tk::AttentionShape shape{2, 2, 3, 5, 4};
  const Case c = random_case(shape, 11);
  const float scale = 0.5f;
  std::vector<float> probs(std::size_t(2 * 2 * 3 * 5)), out(c.q.size()), g(c.q.size());
  std::mt19937 rng(3);
  std::normal_distribution<float> n(0.0f, 1.0f);
  for (auto& x : g) x = n(rng);
  REQUIRE(tk::attention_forward(c.q.data(), c.k.data(), c.v.data(), c.mask.data(), shape, scale, probs.data(), out.data()).ok());
  std::vector<float> dq(c.q.size(), 9.0f), dk(c.k.size(), 9.0f), dv(c.v.size(), 9.0f);   // every element must be written
  REQUIRE(tk::attention_backward(c.q.data(), c.k.data(), c.v.data(), probs.data(), g.data(), shape, scale, dq.data(),
                                 dk.data(), dv.data()).ok());
  auto loss = [&](const std::vector<double>& q, const std::vector<double>& k, const std::vector<double>& v) {
    const auto o = reference(c, q, k, v, scale);
    double l = 0;
    for (std::size_t i = 0; i < o.size(); ++i) l += o[i] * g[i];
    return l;
  };
  const double h = 1e-6;
  auto check_grad = [&](int which, const std::vector<float>& got) {
    for (std::size_t e = 0; e < got.size(); ++e) {
      auto q = wide(c.q), k = wide(c.k), v = wide(c.v);
      auto& x = which == 0 ? q : which == 1 ? k : v;
      x[e] += h;
      const double up = loss(q, k, v);
      x[e] -= 2 * h;
      const double down = loss(q, k, v);
      CAPTURE(which);
      CAPTURE(e);
      CHECK(got[e] == doctest::Approx((up - down) / (2 * h)).epsilon(1e-4).scale(1.0));
    }
  };
  check_grad(0, dq);
  check_grad(1, dk);
  check_grad(2, dv);
}

TEST_CASE("fused attention refuses bad shapes and null pointers") {
  std::vector<float> x(64), p(64), o(64);
  CHECK_FALSE(tk::attention_forward(x.data(), x.data(), x.data(), nullptr, {1, 1, 4, 3, 4}, 1.0f, p.data(), o.data()).ok());
  CHECK_FALSE(tk::attention_forward(x.data(), x.data(), x.data(), nullptr, {1, 1, 2, 2, 0}, 1.0f, p.data(), o.data()).ok());
  CHECK_FALSE(tk::attention_forward(nullptr, x.data(), x.data(), nullptr, {1, 1, 2, 2, 4}, 1.0f, p.data(), o.data()).ok());
  CHECK_FALSE(tk::attention_backward(x.data(), x.data(), x.data(), p.data(), o.data(), {1, 1, 2, 2, 4}, 1.0f, x.data(),
                                     nullptr, x.data()).ok());
  CHECK(tk::attention_forward(x.data(), x.data(), x.data(), nullptr, {1, 1, 2, 2, 4}, 1.0f, p.data(), o.data()).ok());
}

TEST_CASE("fused attention reads keys and values in place from longer tiles (a KV cache's first positions)") {
  const tk::AttentionShape packed{2, 3, 1, 4, 8};
  const Case c = random_case(packed, 5);
  const std::int64_t rows = 7, tiles = 2 * 3;
  std::vector<float> k(std::size_t(tiles * rows * 8), 99.0f), v(k.size(), 99.0f);   // rows past Tk must not be read
  for (std::int64_t t = 0; t < tiles; ++t) {
    for (std::int64_t e = 0; e < 4 * 8; ++e) {
      k[std::size_t(t * rows * 8 + e)] = c.k[std::size_t(t * 4 * 8 + e)];
      v[std::size_t(t * rows * 8 + e)] = c.v[std::size_t(t * 4 * 8 + e)];
    }
  }
  tk::AttentionShape cached = packed;
  cached.key_rows = rows;
  std::vector<float> p1(std::size_t(tiles * 4)), p2(p1.size()), o1(c.q.size()), o2(c.q.size());
  REQUIRE(tk::attention_forward(c.q.data(), c.k.data(), c.v.data(), c.mask.data(), packed, 0.3f, p1.data(), o1.data()).ok());
  REQUIRE(tk::attention_forward(c.q.data(), k.data(), v.data(), c.mask.data(), cached, 0.3f, p2.data(), o2.data()).ok());
  CHECK(o1 == o2);
  CHECK(p1 == p2);
  cached.key_rows = 3;   // fewer rows than keys
  CHECK_FALSE(tk::attention_forward(c.q.data(), k.data(), v.data(), c.mask.data(), cached, 0.3f, p2.data(), o2.data()).ok());
}
