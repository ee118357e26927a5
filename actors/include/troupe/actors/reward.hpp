// Reward actor: rule verifiers that score a response against the task's ground truth, reporting
// format validity apart from correctness. Verifiers are registered by name.
//   "exact_match": format ok = finished and non-empty; correct = response == ground truth.
//   "integer":     format ok = finished, 1..18 characters, digits with an optional leading '-';
//                  correct = format ok and the same integer as the ground truth.
// Reward: 1 when correct, else 0 (RewardConfig can give partial credit for a valid format).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "troupe/actors/types.hpp"

namespace troupe::actors {

// Returns format_ok and correct; the Reward actor turns them into a reward.
using Verifier = std::function<RewardResult(const ScoreItem&)>;
void register_verifier(const std::string& name, Verifier verifier);
Verifier find_verifier(const std::string& name);   // throws std::invalid_argument if unknown

struct RewardConfig {
  std::string verifier = "exact_match";
  float format_reward = 0.0f;   // reward of a well-formed but wrong answer
  MSGPACK_DEFINE(verifier, format_reward);
};

class Reward {
 public:
  explicit Reward(RewardConfig config);
  std::vector<RewardResult> score(std::vector<ScoreItem> items);

 private:
  RewardConfig config_;
  Verifier verifier_;
};

}  // namespace troupe::actors

TROUPE_ACTOR(troupe::actors::Reward, score);
