// Advantage estimators (torch-free: plain vectors in, plain vectors out; math in troupe::kernels),
// registered by name so that an algorithm names the one it uses ("grpo", "rloo", "reinforce++",
// "reinforce++_baseline", "gae") and a user can add their own with TROUPE_ADVANTAGE_ESTIMATOR (at
// namespace scope: it then exists in worker processes too, which never run main).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace troupe::rl {

// GRPO outcome advantages (Shao et al. 2024, arXiv:2402.03300, sec. 4.1.2).
// rewards [B * G], the G samples of one prompt adjacent -> [B * G]:
//   A_i = (r_i - mean_g) / (std_g + eps), std unbiased (divides by G - 1) as torch.std and verl;
//   a group whose rewards are all equal gets A = 0 (it carries no signal).
// Throws std::invalid_argument when rewards.size() is not a multiple of group_size.
std::vector<float> group_advantages(const std::vector<float>& rewards, std::int64_t group_size, double eps = 1e-6);

// What an estimator reads. Outcome estimators use `rewards` (one per sample, the samples of one
// prompt adjacent in groups of `group_size`); token-level ones (GAE) the [n x tokens] arrays.
struct AdvantageInput {
  std::vector<float> rewards;              // [n]
  std::int64_t group_size = 1;
  std::int64_t tokens = 0;                 // the row length of the token-level arrays; 0: none
  std::vector<float> token_rewards;        // [n x tokens]: the outcome at the last valid token, plus any per-token penalty
  std::vector<float> values;               // [n x tokens]: the critic's V per token
  std::vector<std::uint8_t> mask;          // [n x tokens]: 1 on response tokens; empty: all
  std::map<std::string, double> options;   // the estimator's own (eps, gamma, lambda, whiten)
};

struct AdvantageOutput {
  std::vector<float> advantages;   // [n], or [n x tokens] when per_token
  std::vector<float> returns;      // [n x tokens]: the critic's targets (GAE); empty otherwise
  bool per_token = false;
};

using AdvantageEstimator = std::function<AdvantageOutput(const AdvantageInput&)>;

// A later registration under the same name replaces the earlier. Thread-safe.
void register_advantage_estimator(const std::string& name, AdvantageEstimator estimator);
// Throws std::invalid_argument naming an unknown estimator.
const AdvantageEstimator& find_advantage_estimator(const std::string& name);

// The built-in estimators, each registered under the name given. Each throws std::invalid_argument
// for inputs of the wrong shape.
//
// "grpo": group_advantages above; option eps (1e-6).
AdvantageOutput grpo_advantages(const AdvantageInput& in);
// "rloo" (Ahmadian et al. 2024, "Back to Basics", arXiv:2402.14740, eq. 7): each sample's baseline
// is the mean reward of the other G - 1 samples of its prompt: A_i = r_i - (sum_g r - r_i) / (G - 1).
// A group of one gets A = 0.
AdvantageOutput rloo_advantages(const AdvantageInput& in);
// "reinforce++" (Hu et al. 2025, arXiv:2501.03262, sec. 3): the rewards whitened over the whole
// batch, A_i = (r_i - mean) / (std + eps) (population std), no critic and no per-prompt baseline.
AdvantageOutput reinforce_pp_advantages(const AdvantageInput& in);
// "reinforce++_baseline" (the same paper's variant for groups): the group mean subtracted first,
// then the batch-wide whitening above.
AdvantageOutput reinforce_pp_baseline_advantages(const AdvantageInput& in);
// "gae" (Schulman et al. 2016, arXiv:1506.02438): per token over each response, from token_rewards
// and values (troupe::kernels::gae); options gamma (1.0), lambda (0.95), whiten (1: the advantages
// whitened over the valid tokens of the batch, as PPO implementations do; the returns are not).
AdvantageOutput gae_advantages(const AdvantageInput& in);

}  // namespace troupe::rl

#define TROUPE_DETAIL_ADV_CAT2(a, b) a##b
#define TROUPE_DETAIL_ADV_CAT(a, b) TROUPE_DETAIL_ADV_CAT2(a, b)
// Registers `fn` (an AdvantageEstimator) as `name` at static initialisation: at namespace scope.
#define TROUPE_ADVANTAGE_ESTIMATOR(name, fn)                                                      \
  static const bool TROUPE_DETAIL_ADV_CAT(troupe_advantage_estimator_, __COUNTER__) [[maybe_unused]] = \
      (::troupe::rl::register_advantage_estimator(name, fn), true)
