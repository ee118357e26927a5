#include "troupe/rl/rollouts.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <charconv>
#include <stdexcept>
#include <utility>
#include <vector>

#include "troupe/placement/balancer.hpp"

namespace troupe::rl {
namespace {

int parse_count(const std::string& text, std::string_view part) {
  int v = 0;
  auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), v);
  if (ec != std::errc{} || end != part.data() + part.size() || part.empty())
    throw std::invalid_argument("rollouts '" + text + "': expected MIN:MAX (or N), e.g. 1:3");
  return v;
}

// Worth sending to engine 0 instead: the member is gone, or none is left.
bool member_lost(const Error& e) { return e.code == ErrorCode::ActorDied || e.code == ErrorCode::Unavailable; }

}  // namespace

RolloutRange RolloutRange::parse(const std::string& text) {
  RolloutRange r;
  const auto colon = text.find(':');
  if (colon == std::string::npos) {
    r.min = r.max = parse_count(text, text);
  } else {
    r.min = parse_count(text, std::string_view(text).substr(0, colon));
    r.max = parse_count(text, std::string_view(text).substr(colon + 1));
  }
  if (r.min < 1 || r.max < r.min || r.max > 1000)
    throw std::invalid_argument("rollouts '" + text + "': needs 1 <= MIN <= MAX <= 1000 (engine 0, beside the trainer, counts)");
  return r;
}

RolloutPool::RolloutPool(Runtime& rt, ActorRef<actors::RolloutEngine> engine0, ActorRef<WeightStore> store, RolloutRange range,
                         const Options& member, const actors::RolloutConfig& config, std::chrono::milliseconds wait)
    : engine0_(std::move(engine0)), store_(std::move(store)) {
  if (range.max <= 1) return;
  group_.emplace(rt.spawn_elastic_group<actors::RolloutEngine>(
      Elastic{range.min - 1, range.max - 1}.name("rollout").wait_for_min(wait), member, config));
  // A member enters an epoch with the current weights, never stale ones; before the first
  // publish there is nothing to pull (pull_weights reaches it then).
  group_->on_join([this](const ActorRef<actors::RolloutEngine>& e) {
    if (published_) e.call(&actors::RolloutEngine::pull_weights, store_).get();
  });
}

RolloutPool::~RolloutPool() {
  if (!group_) return;
  if (auto st = group_->remove(); !st.ok()) spdlog::warn("rollout pool: removing its group: {}", st.error().to_string());
}

std::size_t RolloutPool::members() const { return group_ ? group_->size() : 0; }

void RolloutPool::pull_weights(std::int64_t version) {
  settle();   // a pull before it that no generate took
  published_ = true;
  version_ = version;
  // Engine 0 in this process with no member: its pull runs on this thread (call_sync), nothing to save.
  if (!engine0_.remote() && !group_) return check_pulled(engine0_.call_sync(&actors::RolloutEngine::pull_weights, store_));
  pulling_ = engine0_.call(&actors::RolloutEngine::pull_weights, store_);   // beside the members' pulls
  if (group_) {
    auto slots = group_->call_all(&actors::RolloutEngine::pull_weights, store_).result();
    if (!slots.ok()) spdlog::warn("rollout pool: {}", slots.error().to_string());
    else
      for (const auto& s : *slots) {
        if (!s.ok()) spdlog::warn("rollout pool: a member did not pull the new weights: {}", s.error().to_string());
      }
  }
  if (!engine0_.remote()) settle();
}

void RolloutPool::settle() {
  if (!pulling_.valid()) return;
  const Future<std::int64_t> pull = std::exchange(pulling_, {});
  check_pulled(pull.get());   // or its CallError, if it failed
}

void RolloutPool::check_pulled(std::int64_t got) const {
  if (got != version_)
    throw std::runtime_error("rollout engine 0 pulled version " + std::to_string(got) + " from the weight store, not the trainer's " +
                             std::to_string(version_));
}

actors::RolloutBatch RolloutPool::generate(const actors::GenerateRequest& whole, int* engines) {
  const std::size_t n = whole.prompts.size();
  const std::size_t k = std::min(n, 1 + members());
  if (engines != nullptr) *engines = int(std::max<std::size_t>(1, k));
  if (k <= 1) {
    if (!pulling_.valid()) return engine0_.call_sync(&actors::RolloutEngine::generate, whole);
    auto batch = engine0_.call(&actors::RolloutEngine::generate, whole);   // behind the pull, in one write
    settle();
    return std::move(batch).get();
  }
  std::int32_t width = whole.prompt_width;   // one width for every part: the whole batch's
  for (const auto& p : whole.prompts) width = std::max(width, std::int32_t(p.size()));

  std::vector<std::int64_t> costs(n);   // the tokens each prompt's samples will hold
  for (std::size_t i = 0; i < n; ++i)
    costs[i] = std::int64_t(whole.samples_per_prompt) * (std::int64_t(whole.prompts[i].size()) + whole.sampling.max_new_tokens);
  const placement::Partition split = placement::partition_kk(costs, k);
  std::vector<actors::GenerateRequest> requests(k);
  std::vector<std::vector<std::int64_t>> rows(k);   // each part's prompts in `whole`
  for (std::size_t j = 0; j < k; ++j) {
    auto& r = requests[j];
    r.samples_per_prompt = whole.samples_per_prompt;
    r.sampling = whole.sampling;
    r.prompt_width = width;
    for (std::size_t i : split.members[j]) {
      r.prompts.push_back(whole.prompts[i]);
      r.prompt_index.push_back(whole.prompt_index.empty() ? std::int64_t(i) : whole.prompt_index[i]);   // keys its samples
      rows[j].push_back(std::int64_t(i));
    }
  }
  std::vector<Future<actors::RolloutBatch>> futures;
  futures.push_back(engine0_.call(&actors::RolloutEngine::generate, requests[0]));
  const auto group = group_->retryable();   // a dead member's part goes to another member
  for (std::size_t j = 1; j < k; ++j)
    futures.push_back(group.call_balanced(split.loads[j], &actors::RolloutEngine::generate, requests[j]));
  settle();   // engine 0's pull, before its generate

  std::vector<actors::RolloutPart> parts;
  for (std::size_t j = 0; j < k; ++j) {
    auto got = futures[j].result();
    const bool stale = got.ok() && published_ && std::any_of(got->policy_version.begin(), got->policy_version.end(),
                                               [&](std::int64_t v) { return v != version_; });
    if (j > 0 && ((!got.ok() && member_lost(got.error())) || stale)) {
      spdlog::warn("rollout pool: part {} of {} goes to engine 0: {}", j, k,
                   stale ? std::string("its member served an older version") : got.error().to_string());
      got = engine0_.call(&actors::RolloutEngine::generate, requests[j]).result();
    }
    parts.push_back(actors::RolloutPart{std::move(rows[j]), std::move(got).value()});
  }
  return actors::merge_rollouts(parts, whole.samples_per_prompt);
}

}  // namespace troupe::rl
