#include "troupe/kernels/advantage.hpp"

#include <cmath>

#include <doctest/doctest.h>

#include "reference.hpp"

namespace tk = troupe::kernels;
using namespace troupe::kernels::testing;

namespace {

constexpr double kTol = 1e-5;

struct Expected {
  std::vector<double> adv, mean, std_dev;
};

Expected reference(const std::vector<float>& s, std::int64_t groups, std::int64_t g,
                   const tk::AdvantageOptions& o) {
  Expected e;
  for (std::int64_t k = 0; k < groups; ++k) {
    double mean = 0.0, ss = 0.0;
    for (std::int64_t i = 0; i < g; ++i) mean += s[std::size_t(k * g + i)];
    mean /= double(g);
    for (std::int64_t i = 0; i < g; ++i) ss += std::pow(s[std::size_t(k * g + i)] - mean, 2);
    const double sd = g > 1 ? std::sqrt(ss / double(o.unbiased_std ? g - 1 : g)) : 0.0;
    for (std::int64_t i = 0; i < g; ++i) {
      const double c = s[std::size_t(k * g + i)] - mean;
      e.adv.push_back(g == 1 ? 0.0 : (o.scale_by_std ? c / (sd + o.epsilon) : c));
    }
    e.mean.push_back(mean);
    e.std_dev.push_back(sd);
  }
  return e;
}

void check(std::int64_t groups, std::int64_t g, const tk::AdvantageOptions& o, std::uint64_t seed) {
  const auto s = uniform(std::size_t(groups * g), -1.0f, 3.0f, seed);
  auto adv = poisoned(s.size()), mean = poisoned(std::size_t(groups)), sd = poisoned(std::size_t(groups));
  REQUIRE(tk::group_advantages(s.data(), groups, g, adv.data(), mean.data(), sd.data(), o).ok());
  const Expected e = reference(s, groups, g, o);
  check_all_close(adv, e.adv, kTol);
  check_all_close(mean, e.mean, kTol);
  check_all_close(sd, e.std_dev, kTol);
}

}  // namespace

TEST_CASE("group advantages match an fp64 reference for GRPO's default options") {
  check(128, 8, {}, 1);
  check(3, 64, {}, 2);
  check(20000, 16, {}, 3);  // enough groups to fork
}

TEST_CASE("group advantages honour the population std, no std scaling and a large epsilon") {
  check(50, 5, {1e-6f, true, false}, 4);
  check(50, 5, {1e-6f, false, true}, 5);
  check(50, 5, {0.5f, true, true}, 6);
}

TEST_CASE("a group of one gets advantage 0 and std 0") {
  check(7, 1, {}, 7);
  const float s = 4.0f;
  float adv = kNaN;
  REQUIRE(tk::group_advantages(&s, 1, 1, &adv, nullptr, nullptr, {0.0f, true, true}).ok());
  CHECK(adv == 0.0f);
}

TEST_CASE("a group whose rewards are all equal gets advantage 0") {
  const std::vector<float> s(8, 1.0f);
  auto adv = poisoned(8);
  REQUIRE(tk::group_advantages(s.data(), 2, 4, adv.data()).ok());
  for (float a : adv) CHECK(a == 0.0f);
}

TEST_CASE("group_advantages rejects a zero group size and null pointers") {
  const float s = 1.0f;
  float a = kNaN;
  CHECK(tk::group_advantages(&s, 1, 0, &a).error().code == tk::KernelCode::BadArguments);
  CHECK(tk::group_advantages(nullptr, 1, 1, &a).error().code == tk::KernelCode::BadArguments);
  CHECK(std::isnan(a));
  CHECK(tk::group_advantages(nullptr, 0, 4, nullptr).ok());
}
