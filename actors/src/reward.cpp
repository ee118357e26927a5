#include "troupe/actors/reward.hpp"

#include <stdexcept>

#include "troupe/named_registry.hpp"

namespace troupe::actors {
namespace {

RewardResult exact_match(const ScoreItem& item) {
  RewardResult r;
  r.format_ok = item.finished && !item.response.empty();
  r.correct = r.format_ok && item.response == item.ground_truth;
  return r;
}

bool is_integer(const std::string& s) {
  std::size_t i = (!s.empty() && s[0] == '-') ? 1 : 0;
  if (s.size() <= i || s.size() > 18) return false;
  for (; i < s.size(); ++i) if (s[i] < '0' || s[i] > '9') return false;
  return true;
}

RewardResult integer_match(const ScoreItem& item) {
  RewardResult r;
  r.format_ok = item.finished && is_integer(item.response);
  r.correct = r.format_ok && is_integer(item.ground_truth) && std::stoll(item.response) == std::stoll(item.ground_truth);
  return r;
}

NamedRegistry<Verifier>& registry() {
  static NamedRegistry<Verifier> r("verifier");
  static const bool built_in = (r.put("exact_match", &exact_match), r.put("integer", &integer_match), true);
  (void)built_in;
  return r;
}

}  // namespace

void register_verifier(const std::string& name, Verifier verifier) { registry().put(name, std::move(verifier)); }

Verifier find_verifier(const std::string& name) { return registry().at(name); }

Reward::Reward(RewardConfig config) : config_(std::move(config)), verifier_(find_verifier(config_.verifier)) {}

std::vector<RewardResult> Reward::score(std::vector<ScoreItem> items) {
  std::vector<RewardResult> out;
  out.reserve(items.size());
  for (auto& item : items) {
    RewardResult r = verifier_(item);
    r.reward = r.correct ? 1.0f : (r.format_ok ? config_.format_reward : 0.0f);
    out.push_back(r);
  }
  return out;
}

}  // namespace troupe::actors
