#include "troupe/kernels/logprob.hpp"

#include <cmath>
#include <cstring>
#include <thread>

#include <doctest/doctest.h>

#include "reference.hpp"

namespace tk = troupe::kernels;
using namespace troupe::kernels::testing;

namespace {

constexpr double kTol = 1e-5;  // the header's stated tolerance

struct Expected {
  std::vector<double> logprob, entropy;
};

// Naive fp64 log-softmax of each row of x / temperature, then gather and entropy.
Expected reference(const std::vector<float>& x, std::int64_t rows, std::int64_t vocab,
                   std::int64_t stride, const std::vector<std::int64_t>& tokens, double temp) {
  Expected e;
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* row = x.data() + r * stride;
    double m = -INFINITY;
    for (std::int64_t v = 0; v < vocab; ++v) m = std::max(m, row[v] / temp);
    double s = 0.0;
    for (std::int64_t v = 0; v < vocab; ++v) s += std::exp(row[v] / temp - m);
    const double lse = m + std::log(s);
    double h = 0.0;
    for (std::int64_t v = 0; v < vocab; ++v) {
      const double lp = row[v] / temp - lse;
      if (std::isfinite(lp)) h -= std::exp(lp) * lp;
    }
    const bool defined = m != -INFINITY;
    const std::int64_t t = tokens[std::size_t(r)];
    const bool in_range = t >= 0 && t < vocab;
    e.logprob.push_back(defined && in_range ? row[t] / temp - lse : NAN);
    e.entropy.push_back(defined ? h : NAN);
  }
  return e;
}

std::vector<std::int64_t> random_tokens(std::int64_t rows, std::int64_t vocab, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::int64_t> d(0, vocab - 1);
  std::vector<std::int64_t> t(static_cast<std::size_t>(rows));
  for (auto& v : t) v = d(rng);
  return t;
}

std::vector<tk::bf16> to_bf16(const std::vector<float>& x) {
  std::vector<tk::bf16> out;
  for (float v : x) out.push_back(tk::to_bf16(v));
  return out;
}

std::vector<float> widen(const std::vector<tk::bf16>& x) {
  std::vector<float> out;
  for (tk::bf16 v : x) out.push_back(tk::to_float(v));
  return out;
}

void check_fp32(std::int64_t rows, std::int64_t vocab, std::int64_t stride, float temp,
                std::uint64_t seed) {
  const auto x = normal(std::size_t(rows * stride), 4.0f, seed);
  const auto tokens = random_tokens(rows, vocab, seed + 1);
  auto lp = poisoned(std::size_t(rows)), h = poisoned(std::size_t(rows));
  tk::LogprobOptions o{stride, temp};
  REQUIRE(tk::logprob_gather(x.data(), rows, vocab, tokens.data(), lp.data(), h.data(), o).ok());
  const Expected e = reference(x, rows, vocab, stride, tokens, temp);
  check_all_close(lp, e.logprob, kTol);
  check_all_close(h, e.entropy, kTol);
}

}  // namespace

TEST_CASE("fp32 logprobs and entropies match an fp64 log-softmax on random logits") {
  check_fp32(37, 5000, 5000, 1.0f, 11);     // several chunks and a ragged tail
  check_fp32(8, 33, 33, 1.0f, 12);          // shorter than one chunk
  check_fp32(5, 4096, 4100, 1.0f, 13);      // strided rows (a slice of a wider tensor)
  check_fp32(9, 3000, 3000, 0.7f, 14);      // temperature
}

TEST_CASE("fp32 logprobs stay within tolerance at a vocab of 2^20") {
  check_fp32(2, 1 << 20, 1 << 20, 1.0f, 15);
}

TEST_CASE("bf16 logprobs match an fp64 log-softmax of the same bf16 values") {
  const std::int64_t rows = 23, vocab = 7001;
  const auto x = to_bf16(normal(std::size_t(rows * vocab), 3.0f, 21));
  const auto tokens = random_tokens(rows, vocab, 22);
  auto lp = poisoned(std::size_t(rows)), h = poisoned(std::size_t(rows));
  REQUIRE(tk::logprob_gather(x.data(), rows, vocab, tokens.data(), lp.data(), h.data()).ok());
  const Expected e = reference(widen(x), rows, vocab, vocab, tokens, 1.0);
  check_all_close(lp, e.logprob, kTol);
  check_all_close(h, e.entropy, kTol);
}

TEST_CASE("a vocab of one gives logprob 0 and entropy 0") {
  const std::vector<float> x{3.5f, -2.0f, 0.0f};
  const std::vector<std::int64_t> tokens{0, 0, 0};
  auto lp = poisoned(3), h = poisoned(3);
  REQUIRE(tk::logprob_gather(x.data(), 3, 1, tokens.data(), lp.data(), h.data()).ok());
  for (int r = 0; r < 3; ++r) {
    CHECK(lp[r] == 0.0f);
    CHECK(h[r] == doctest::Approx(0.0).epsilon(1e-7));
  }
}

TEST_CASE("-inf logits get zero probability and a row of only -inf gives NaN") {
  const std::int64_t vocab = 3000;
  auto x = normal(3 * vocab, 2.0f, 31);
  for (std::int64_t v = 0; v < vocab; v += 3) x[std::size_t(v)] = -kInf;           // row 0: a third masked
  for (std::int64_t v = 0; v < 2500; ++v) x[std::size_t(vocab + v)] = -kInf;       // row 1: first chunk masked
  for (std::int64_t v = 0; v < vocab; ++v) x[std::size_t(2 * vocab + v)] = -kInf;  // row 2: all masked
  const std::vector<std::int64_t> tokens{0, 2999, 5};  // row 0's token is itself a -inf logit
  auto lp = poisoned(3), h = poisoned(3);
  REQUIRE(tk::logprob_gather(x.data(), 3, vocab, tokens.data(), lp.data(), h.data()).ok());
  const Expected e = reference(x, 3, vocab, vocab, tokens, 1.0);
  CHECK(lp[0] == -kInf);
  CHECK(close(h[0], e.entropy[0], kTol));
  CHECK(close(lp[1], e.logprob[1], kTol));
  CHECK(close(h[1], e.entropy[1], kTol));
  CHECK(std::isnan(lp[2]));
  CHECK(std::isnan(h[2]));
}

TEST_CASE("a token outside the vocab gives a NaN logprob but a valid entropy") {
  const auto x = normal(2 * 100, 1.0f, 41);
  const std::vector<std::int64_t> tokens{-1, 100};
  auto lp = poisoned(2), h = poisoned(2);
  REQUIRE(tk::logprob_gather(x.data(), 2, 100, tokens.data(), lp.data(), h.data()).ok());
  CHECK(std::isnan(lp[0]));
  CHECK(std::isnan(lp[1]));
  CHECK(std::isfinite(h[0]));
  CHECK(std::isfinite(h[1]));
}

TEST_CASE("entropy may be omitted and results do not depend on the thread count") {
  const std::int64_t rows = 64, vocab = 8192;  // big enough to fork
  const auto x = normal(std::size_t(rows * vocab), 3.0f, 51);
  const auto tokens = random_tokens(rows, vocab, 52);
  auto one = poisoned(std::size_t(rows)), two = poisoned(std::size_t(rows));
  tk::set_num_threads(1);
  REQUIRE(tk::logprob_gather(x.data(), rows, vocab, tokens.data(), one.data()).ok());
  tk::set_num_threads(4);
  REQUIRE(tk::logprob_gather(x.data(), rows, vocab, tokens.data(), two.data()).ok());
  tk::set_num_threads(int(std::thread::hardware_concurrency()));
  CHECK(std::memcmp(one.data(), two.data(), one.size() * sizeof(float)) == 0);
  check_all_close(one, reference(x, rows, vocab, vocab, tokens, 1.0).logprob, kTol);
}

TEST_CASE("logprob_gather rejects bad arguments without writing") {
  const std::vector<float> x(8, 0.0f);
  const std::vector<std::int64_t> tokens{0, 0};
  auto lp = poisoned(2);
  CHECK(tk::logprob_gather(x.data(), 2, 0, tokens.data(), lp.data()).error().code == tk::KernelCode::BadArguments);
  CHECK(tk::logprob_gather(x.data(), 2, 4, tokens.data(), lp.data(), nullptr, {2, 1.0f}).error().code ==
        tk::KernelCode::BadArguments);
  CHECK(tk::logprob_gather(x.data(), 2, 4, tokens.data(), lp.data(), nullptr, {0, 0.0f}).error().code ==
        tk::KernelCode::BadArguments);
  CHECK(tk::logprob_gather(x.data(), 2, 4, nullptr, lp.data()).error().code == tk::KernelCode::BadArguments);
  CHECK(std::isnan(lp[0]));
  CHECK(tk::logprob_gather(x.data(), 0, 4, nullptr, nullptr).ok());  // zero rows: nothing to do
}
