#include "troupe/rl/advantages.hpp"

#include <stdexcept>
#include <string>

#include "troupe/kernels/advantage.hpp"

namespace troupe::rl {

std::vector<float> group_advantages(const std::vector<float>& rewards, std::int64_t group_size, double eps) {
  const auto n = std::int64_t(rewards.size());
  if (group_size < 1 || n % group_size != 0)
    throw std::invalid_argument("group_advantages: " + std::to_string(n) + " rewards in groups of " + std::to_string(group_size));
  std::vector<float> out(rewards.size());
  kernels::AdvantageOptions opts;
  opts.epsilon = float(eps);
  auto st = kernels::group_advantages(rewards.data(), n / group_size, group_size, out.data(), nullptr, nullptr, opts);
  if (!st.ok()) throw ErrorException(Error{st.error().code, "group_advantages: " + st.error().message});
  return out;
}

}  // namespace troupe::rl
