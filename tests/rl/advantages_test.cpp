// The advantage estimators by name: hand-computed values, the registry, and a user's own
// estimator registered with the macro (as examples/ and user programs do).
#include "troupe/rl/advantages.hpp"
#include "troupe/rl/kl_controller.hpp"

#include <cmath>
#include <stdexcept>

#include <doctest/doctest.h>

#include "troupe/kernels/gae.hpp"

using namespace troupe::rl;

namespace {

// A user's estimator: the rewards themselves, no baseline.
AdvantageOutput raw_rewards(const AdvantageInput& in) { return AdvantageOutput{in.rewards, {}, false}; }
TROUPE_ADVANTAGE_ESTIMATOR("test_raw_rewards", raw_rewards);

AdvantageInput outcomes(std::vector<float> r, std::int64_t g) {
  AdvantageInput in;
  in.rewards = std::move(r);
  in.group_size = g;
  return in;
}

}  // namespace

TEST_CASE("rloo: each sample's baseline is the mean of the other samples of its prompt") {
  auto out = find_advantage_estimator("rloo")(outcomes({1, 0, 0, 1, 3, 3, 3, 3}, 4));
  REQUIRE(out.advantages.size() == 8);
  CHECK(out.advantages[0] == doctest::Approx(1.0 - 1.0 / 3.0));   // 1 - (0 + 0 + 1) / 3
  CHECK(out.advantages[1] == doctest::Approx(0.0 - 2.0 / 3.0));
  for (int i = 4; i < 8; ++i) CHECK(out.advantages[std::size_t(i)] == doctest::Approx(0.0));
  CHECK_FALSE(out.per_token);
  CHECK(find_advantage_estimator("rloo")(outcomes({5, 7}, 1)).advantages == std::vector<float>{0, 0});   // no peers
  CHECK_THROWS_AS(find_advantage_estimator("rloo")(outcomes({1, 0, 1}, 2)), std::invalid_argument);
}

TEST_CASE("reinforce++ whitens the rewards over the batch, its baseline variant after the group means") {
  auto pp = find_advantage_estimator("reinforce++")(outcomes({1, 0, 0, 1, 1, 1, 1, 1}, 4));
  const double sd = std::sqrt(0.1875);   // mean 0.75, population variance 0.1875
  CHECK(pp.advantages[0] == doctest::Approx(0.25 / sd));
  CHECK(pp.advantages[1] == doctest::Approx(-0.75 / sd));
  auto base = find_advantage_estimator("reinforce++_baseline")(outcomes({1, 0, 0, 1, 1, 1, 1, 1}, 4));
  // Group means 0.5 and 1: [.5, -.5, -.5, .5, 0, 0, 0, 0], population std sqrt(1/8).
  CHECK(base.advantages[0] == doctest::Approx(0.5 / std::sqrt(0.125)));
  CHECK(base.advantages[1] == doctest::Approx(-0.5 / std::sqrt(0.125)));
  CHECK(base.advantages[5] == doctest::Approx(0.0));
}

TEST_CASE("grpo by name is group_advantages") {
  const std::vector<float> r{1, 0, 0, 1, 1, 1, 1, 1};
  CHECK(find_advantage_estimator("grpo")(outcomes(r, 4)).advantages == group_advantages(r, 4));
}

TEST_CASE("gae by name runs the kernel per token, and whitens the valid tokens unless told not to") {
  AdvantageInput in;
  in.tokens = 4;
  in.token_rewards = {0, 0, 1, 0, /**/ 0, 0, 0, 2};
  in.values = {.1f, .2f, .3f, 9, /**/ .4f, .3f, .2f, .1f};
  in.mask = {1, 1, 1, 0, /**/ 1, 1, 1, 1};
  in.options = {{"gamma", 0.9}, {"lambda", 0.8}, {"whiten", 0}};
  auto raw = find_advantage_estimator("gae")(in);
  REQUIRE(raw.per_token);
  REQUIRE(raw.advantages.size() == 8);
  std::vector<float> adv(8), ret(8);
  REQUIRE(troupe::kernels::gae(in.token_rewards.data(), in.values.data(), in.mask.data(), 2, 4, adv.data(), ret.data(),
                               {0.9f, 0.8f}).ok());
  CHECK(raw.advantages == adv);
  CHECK(raw.returns == ret);
  in.options["whiten"] = 1;
  auto white = find_advantage_estimator("gae")(in);
  double sum = 0, ss = 0;
  for (std::size_t i = 0; i < 8; ++i) {
    if (!in.mask[i]) {
      CHECK(white.advantages[i] == 0.0f);
      continue;
    }
    sum += white.advantages[i];
    ss += double(white.advantages[i]) * white.advantages[i];
  }
  CHECK(sum / 7 == doctest::Approx(0.0).epsilon(1e-6));
  CHECK(ss / 7 == doctest::Approx(1.0).epsilon(1e-5));
  CHECK(white.returns == ret);   // the critic's targets are not whitened
  in.values.pop_back();
  CHECK_THROWS_AS(find_advantage_estimator("gae")(in), std::invalid_argument);
}

TEST_CASE("advantage estimators: a user's registers by macro, an unknown name is refused by name") {
  CHECK(find_advantage_estimator("test_raw_rewards")(outcomes({3, 4}, 2)).advantages == std::vector<float>{3, 4});
  try {
    (void)find_advantage_estimator("nope");
    FAIL("an unknown estimator was found");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()).find("'nope'") != std::string::npos);
  }
}

TEST_CASE("the adaptive KL controller moves the coefficient toward the target, clipped, and a fixed one stays") {
  KlController adaptive(0.1, /*target_kl=*/6.0, /*horizon=*/10000.0);
  // kl 12: error clip(1, -0.2, 0.2) = 0.2 -> 0.1 * (1 + 0.2 * 256 / 10000) = 0.1005120.
  CHECK(adaptive.update(12.0, 256) == doctest::Approx(0.100512));
  // kl 4.5: error -0.25 -> -0.2 -> * (1 - 0.2 * 256 / 10000).
  CHECK(adaptive.update(4.5, 256) == doctest::Approx(0.100512 * (1 - 0.00512)));
  // kl 6.3: error 0.05 -> * (1 + 0.05 * 1000 / 10000).
  const double before = adaptive.value();
  CHECK(adaptive.update(6.3, 1000) == doctest::Approx(before * 1.005));
  KlController fixed(0.04);
  CHECK(fixed.update(100.0, 1000) == doctest::Approx(0.04));
  CHECK_THROWS_AS(adaptive.update(std::nan(""), 1), std::invalid_argument);
  CHECK_THROWS_AS(KlController(-1.0), std::invalid_argument);
  // 5 * horizon samples or more: at error -0.2 the factor 1 - 0.2 * n / horizon is not positive.
  const double kept = adaptive.value();
  CHECK_THROWS_AS(adaptive.update(0.0, 50000), std::invalid_argument);
  CHECK(adaptive.value() == kept);
  CHECK(adaptive.update(0.0, 49999) > 0);
  CHECK(fixed.update(0.0, 50000) == doctest::Approx(0.04));   // a fixed one takes any batch
}
