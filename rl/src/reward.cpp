// The reward role's registry and the library's two backends, "rule" and "model".
#include "troupe/rl/reward.hpp"

#include <filesystem>
#include <stdexcept>

#include "troupe/actors/reward_model.hpp"
#include "troupe/named_registry.hpp"
#include "troupe/rl/run.hpp"

namespace troupe::rl {

namespace {

// The verifier's own rewards.
class RuleReward final : public RewardBackend {
 public:
  std::vector<float> rewards(const RewardInput& in) override {
    std::vector<float> out;
    out.reserve(in.verdicts.size());
    for (const auto& v : in.verdicts) out.push_back(v.reward);
    return out;
  }
};

// A learned reward: the run's architecture with a score head, loaded from build/bin/reward_model's
// file, in a RewardModel actor placed like the reference.
class ModelReward final : public RewardBackend {
 public:
  ModelReward(Run& run, const std::string& path) {
    if (path.empty()) throw std::invalid_argument("reward 'model' needs a file: model:PATH");
    if (!std::filesystem::is_regular_file(path)) throw std::invalid_argument("reward model file '" + path + "' does not exist");
    const RunConfig& c = run.config();
    actors::PolicyConfig rm = c.model.policy;   // vocab_size and seed already the run's
    rm.scalar_heads = {"score"};
    actor_ = run.runtime().spawn<actors::RewardModel>(
        run.role_options("reward_model"),
        actors::RewardModelConfig{rm, std::filesystem::absolute(path).string(), c.placement.reference_threads, c.placement.blas_threads});
  }
  std::vector<float> rewards(const RewardInput& in) override {
    return actor_.call_sync(&actors::RewardModel::score, actors::SequenceBatch{in.samples.tokens, in.samples.attn_mask});
  }
  void stop(Run& run) override { run.runtime().kill(actor_); }

 private:
  ActorRef<actors::RewardModel> actor_;
};

NamedRegistry<RewardBackendFactory>& registry() {
  static NamedRegistry<RewardBackendFactory> r("reward backend");
  static const bool builtins [[maybe_unused]] =
      (r.put("rule", [](Run&, const std::string& arg) -> std::unique_ptr<RewardBackend> {
         if (!arg.empty()) throw std::invalid_argument("reward 'rule' takes no argument, not '" + arg + "'");
         return std::make_unique<RuleReward>();
       }),
       r.put("model", [](Run& run, const std::string& path) -> std::unique_ptr<RewardBackend> {
         return std::make_unique<ModelReward>(run, path);
       }),
       true);
  return r;
}

}  // namespace

void RewardBackend::stop(Run&) {}

void register_reward_backend(const std::string& name, RewardBackendFactory factory) { registry().put(name, std::move(factory)); }

std::vector<std::string> reward_backend_names() { return registry().names(); }

std::unique_ptr<RewardBackend> make_reward_backend(Run& run, const std::string& spec) {
  const auto colon = spec.find(':');
  const std::string name = spec.substr(0, colon), argument = colon == std::string::npos ? "" : spec.substr(colon + 1);
  return registry().at(name)(run, argument);
}

}  // namespace troupe::rl
