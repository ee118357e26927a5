#include "troupe/rl/advantages.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "troupe/error.hpp"
#include "troupe/kernels/advantage.hpp"
#include "troupe/kernels/gae.hpp"
#include "troupe/named_registry.hpp"
#include "troupe/rl/kl_controller.hpp"

namespace troupe::rl {

namespace {

NamedRegistry<AdvantageEstimator>& registry() {
  static NamedRegistry<AdvantageEstimator> r("advantage estimator");
  return r;
}

double option(const AdvantageInput& in, const std::string& key, double fallback) {
  auto it = in.options.find(key);
  return it == in.options.end() ? fallback : it->second;
}

void check_groups(const char* who, std::size_t n, std::int64_t group_size) {
  if (group_size < 1 || std::int64_t(n) % group_size != 0) {
    throw std::invalid_argument(std::string(who) + ": " + std::to_string(n) + " rewards in groups of " +
                                std::to_string(group_size));
  }
}

// (x - mean) / (std + eps) over all of x, the population std, in fp64.
void whiten(std::vector<float>& x, double eps, const std::vector<std::uint8_t>* mask = nullptr) {
  double sum = 0.0, count = 0.0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (mask && !(*mask)[i]) continue;
    sum += x[i];
    count += 1.0;
  }
  if (count == 0.0) return;
  const double mean = sum / count;
  double ss = 0.0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (mask && !(*mask)[i]) continue;
    ss += (x[i] - mean) * (x[i] - mean);
  }
  const double inv = 1.0 / (std::sqrt(ss / count) + eps);
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (mask && !(*mask)[i]) continue;
    x[i] = float((x[i] - mean) * inv);
  }
}

void subtract_group_means(std::vector<float>& r, std::int64_t g) {
  for (std::size_t k = 0; k < r.size(); k += std::size_t(g)) {
    double mean = 0.0;
    for (std::int64_t i = 0; i < g; ++i) mean += r[k + std::size_t(i)];
    mean /= double(g);
    for (std::int64_t i = 0; i < g; ++i) r[k + std::size_t(i)] = float(r[k + std::size_t(i)] - mean);
  }
}

}  // namespace

std::vector<float> group_advantages(const std::vector<float>& rewards, std::int64_t group_size, double eps) {
  check_groups("group_advantages", rewards.size(), group_size);
  const auto n = std::int64_t(rewards.size());
  std::vector<float> out(rewards.size());
  kernels::AdvantageOptions opts;
  opts.epsilon = float(eps);
  auto st = kernels::group_advantages(rewards.data(), n / group_size, group_size, out.data(), nullptr, nullptr, opts);
  if (!st.ok()) throw ErrorException(Error{st.error().code, "group_advantages: " + st.error().message});
  return out;
}

void register_advantage_estimator(const std::string& name, AdvantageEstimator estimator) {
  registry().put(name, std::move(estimator));
}

const AdvantageEstimator& find_advantage_estimator(const std::string& name) { return registry().at(name); }

AdvantageOutput grpo_advantages(const AdvantageInput& in) {
  return AdvantageOutput{group_advantages(in.rewards, in.group_size, option(in, "eps", 1e-6)), {}, false};
}

AdvantageOutput rloo_advantages(const AdvantageInput& in) {
  check_groups("rloo", in.rewards.size(), in.group_size);
  const std::int64_t g = in.group_size;
  AdvantageOutput out;
  out.advantages.resize(in.rewards.size());
  for (std::size_t k = 0; k < in.rewards.size(); k += std::size_t(g)) {
    double sum = 0.0;
    for (std::int64_t i = 0; i < g; ++i) sum += in.rewards[k + std::size_t(i)];
    for (std::int64_t i = 0; i < g; ++i) {
      const double r = in.rewards[k + std::size_t(i)];
      out.advantages[k + std::size_t(i)] = g > 1 ? float(r - (sum - r) / double(g - 1)) : 0.0f;
    }
  }
  return out;
}

AdvantageOutput reinforce_pp_advantages(const AdvantageInput& in) {
  AdvantageOutput out{in.rewards, {}, false};
  whiten(out.advantages, option(in, "eps", 1e-6));
  return out;
}

AdvantageOutput reinforce_pp_baseline_advantages(const AdvantageInput& in) {
  check_groups("reinforce++_baseline", in.rewards.size(), in.group_size);
  AdvantageOutput out{in.rewards, {}, false};
  subtract_group_means(out.advantages, in.group_size);
  whiten(out.advantages, option(in, "eps", 1e-6));
  return out;
}

AdvantageOutput gae_advantages(const AdvantageInput& in) {
  const std::size_t cells = in.token_rewards.size();
  if (in.tokens < 1 || cells % std::size_t(in.tokens) != 0 || in.values.size() != cells ||
      (!in.mask.empty() && in.mask.size() != cells)) {
    throw std::invalid_argument("gae: token_rewards, values and mask must all be [n x tokens] with tokens >= 1");
  }
  kernels::GaeOptions o;
  o.gamma = float(option(in, "gamma", 1.0));
  o.lambda = float(option(in, "lambda", 0.95));
  AdvantageOutput out;
  out.per_token = true;
  out.advantages.resize(cells);
  out.returns.resize(cells);
  const auto rows = std::int64_t(cells) / in.tokens;
  auto st = kernels::gae(in.token_rewards.data(), in.values.data(), in.mask.empty() ? nullptr : in.mask.data(), rows,
                         in.tokens, out.advantages.data(), out.returns.data(), o);
  if (!st.ok()) throw std::invalid_argument("gae: " + st.error().message);
  if (option(in, "whiten", 1.0) != 0.0) whiten(out.advantages, 1e-8, in.mask.empty() ? nullptr : &in.mask);
  return out;
}

KlController::KlController(double initial_coef, double target_kl, double horizon)
    : coef_(initial_coef), target_(target_kl), horizon_(horizon) {
  if (!(initial_coef >= 0.0) || !(horizon > 0.0)) {
    throw std::invalid_argument("KlController: need a coefficient >= 0 and a horizon > 0");
  }
}

double KlController::update(double measured_kl, std::int64_t n_steps) {
  if (n_steps < 0 || !std::isfinite(measured_kl)) throw std::invalid_argument("KlController: n_steps >= 0 and a finite kl");
  if (target_ <= 0.0) return coef_;
  if (double(n_steps) >= 5.0 * horizon_)
    throw std::invalid_argument("KlController: " + std::to_string(n_steps) + " samples a batch need a horizon over " +
                                std::to_string(double(n_steps) / 5.0) + " (the coefficient's factor would not stay positive)");
  const double error = std::clamp(measured_kl / target_ - 1.0, -0.2, 0.2);
  coef_ *= 1.0 + error * double(n_steps) / horizon_;
  return coef_;
}

TROUPE_ADVANTAGE_ESTIMATOR("grpo", grpo_advantages);
TROUPE_ADVANTAGE_ESTIMATOR("rloo", rloo_advantages);
TROUPE_ADVANTAGE_ESTIMATOR("reinforce++", reinforce_pp_advantages);
TROUPE_ADVANTAGE_ESTIMATOR("reinforce++_baseline", reinforce_pp_baseline_advantages);
TROUPE_ADVANTAGE_ESTIMATOR("gae", gae_advantages);

}  // namespace troupe::rl
