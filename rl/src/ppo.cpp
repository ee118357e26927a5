// PPO (Schulman et al. 2017, arXiv:1707.06347) in the RLHF recipe of Ouyang et al. 2022
// (arXiv:2203.02155), token-level as OpenRLHF and verl run it. Per batch of prompts:
//   sample responses from pi_old; score them; values V(s_t) from the critic;
//   r_t = -beta * (log pi_old - log pi_ref)_t on each response token, + the reward at the last;
//   advantages by GAE(gamma, lambda), whitened; returns = advantages + values (before whitening);
//   for each of `updates_per_batch` epochs, over `mini_batches` mini-batches:
//     policy: the clipped surrogate; critic: the clipped value loss (side by side);
//   beta <- the adaptive KL controller (Ziegler et al. 2019) when kl_target > 0.
// The critic is the policy's architecture with a value head and its own AdamW, from the SFT trunk
// (or a reward model's trunk and score head: critic_init); its optimizer state is checkpointed in
// <checkpoint>/critic, the controller's beta in the run state.
#include <algorithm>
#include <filesystem>
#include <optional>
#include <stdexcept>

#include "builtin_algorithms.hpp"
#include "troupe/rl/algorithms.hpp"
#include "troupe/rl/batches.hpp"
#include "troupe/rl/kl_controller.hpp"

namespace troupe::rl {

PpoBatches ppo_batches(const actors::RolloutBatch& samples, const TensorView& ref_logp, const TensorView& values,
                       const std::vector<actors::RewardResult>& rewards, double kl_coef, const RunConfig& config) {
  const std::int64_t n = samples.tokens.shape[0], t = samples.tokens.shape[1];
  if (std::int64_t(rewards.size()) != n) throw std::invalid_argument("ppo_batches: one reward per sample");
  AdvantageInput in;
  in.tokens = t;
  in.token_rewards.assign(std::size_t(n * t), 0.0f);
  in.values.assign(values.data_as<float>(), values.data_as<float>() + n * t);
  in.mask.assign(std::size_t(n * t), 0);
  const bool* resp = samples.response_mask.data_as<bool>();
  const float* old = samples.logprobs.data_as<float>();
  const float* ref = ref_logp.data_as<float>();
  for (std::int64_t r = 0; r < n; ++r) {
    std::int64_t last = -1;
    for (std::int64_t c = 0; c < t; ++c) {
      const std::size_t i = std::size_t(r * t + c);
      if (!resp[i]) continue;
      in.mask[i] = 1;
      in.token_rewards[i] = float(-kl_coef * (double(old[i]) - double(ref[i])));
      last = c;
    }
    if (last >= 0) in.token_rewards[std::size_t(r * t + last)] += rewards[std::size_t(r)].reward;
  }
  in.options = {{"gamma", config.algo.gae_gamma}, {"lambda", config.algo.gae_lambda}, {"whiten", 1.0}};
  const AdvantageOutput gae = find_advantage_estimator("gae")(in);
  auto as_view = [&](const std::vector<float>& x) {
    TensorView v = TensorView::empty(DType::F32, {n, t});
    std::copy(x.begin(), x.end(), v.data_as<float>());
    return v;
  };
  PpoBatches b;
  b.policy.objective = "ppo";
  b.policy.tokens = samples.tokens;
  b.policy.attn_mask = samples.attn_mask;
  b.policy.loss_mask = samples.response_mask;
  b.policy.inputs = {{"old_logp", samples.logprobs}, {"advantages", as_view(gae.advantages)}, {"ref_logp", ref_logp}};
  b.policy.options = {{"clip_eps", config.algo.clip_eps}};
  b.policy.temperature = config.algo.temperature;
  b.policy.micro_batches = config.algo.micro_batches;
  b.critic = b.policy;
  b.critic.objective = "value";
  b.critic.inputs = {{"old_values", values}, {"returns", as_view(gae.returns)}};
  b.critic.options = {{"value_clip", config.algo.value_clip}};
  return b;
}

double sampled_kl(const actors::RolloutBatch& samples, const TensorView& ref_logp) {
  const std::int64_t n = samples.tokens.shape[0], t = samples.tokens.shape[1];
  const bool* resp = samples.response_mask.data_as<bool>();
  const float* old = samples.logprobs.data_as<float>();
  const float* ref = ref_logp.data_as<float>();
  double sum = 0;
  for (std::int64_t i = 0; i < n * t; ++i)
    if (resp[i]) sum += double(old[i]) - double(ref[i]);
  return n > 0 ? sum / double(n) : 0.0;
}

namespace {

class Ppo final : public Algorithm {
 public:
  explicit Ppo(const RunConfig& c) : kl_(c.algo.kl_coef, c.algo.kl_target, c.algo.kl_horizon) {
    if (c.algo.mini_batches < 1) throw std::invalid_argument("ppo: mini_batches must be at least 1");
    if (const double n = double(c.algo.prompts_per_step) * double(c.algo.group_size); c.algo.kl_target > 0 && n >= 5.0 * c.algo.kl_horizon)
      throw std::invalid_argument("ppo: algo.kl_horizon must exceed a fifth of the samples a step (" + std::to_string(n / 5.0) +
                                  "): the adaptive KL coefficient would turn negative");
    if (!c.algo.critic_init.empty() && !std::filesystem::is_regular_file(c.algo.critic_init))
      throw std::invalid_argument("critic init file '" + c.algo.critic_init + "' does not exist");
  }

  void spawn(Run& run) override {   // the critic: the policy's architecture with a value head
    const RunConfig& c = run.config();
    actors::PolicyConfig model = c.model.policy;
    model.scalar_heads = {"value"};
    critic_ = run.runtime().spawn<actors::Trainer>(
        run.role_options("critic"), actors::TrainerConfig{model, c.algo.critic_optim, c.placement.trainer_threads, c.placement.blas_threads});
  }

  void after_warm_start(Run& run) override {
    if (run.config().algo.critic_init.empty()) {   // the SFT trunk, a fresh value head
      critic_->call_sync(&actors::Trainer::load_trunk, run.sft_weights_path());
    } else {   // a reward model's trunk, its score head as the value head
      critic_->call_sync(&actors::Trainer::load_trunk_as, run.config().algo.critic_init, std::string("score"), std::string("value"));
    }
  }

  StepRecord step(Run& run) override {
    const RunConfig& c = run.config();
    StepClock clock;
    const auto prompts = run.next_prompts();
    const auto samples = run.generate(prompts);
    clock.lap(&StepTimes::rollout);
    const auto rewards = run.score(prompts, samples);
    clock.lap(&StepTimes::reward);
    auto values = critic_->call(&actors::Trainer::head_values, actors::SequenceBatch{samples.tokens, samples.attn_mask},
                                std::string("value"));
    const auto ref_logp = run.reference_logprobs(samples);
    const double beta = kl_.value();
    const PpoBatches batch = ppo_batches(samples, ref_logp, values.get(), rewards, beta, c);   // token rewards, GAE
    clock.lap(&StepTimes::reference);
    const std::int64_t n = samples.tokens.shape[0], rows = (n + c.algo.mini_batches - 1) / c.algo.mini_batches;
    actors::TrainMetrics m, v;
    for (std::int32_t epoch = 0; epoch < std::max(1, c.algo.updates_per_batch); ++epoch) {
      for (std::int64_t begin = 0; begin < n; begin += rows) {
        const std::int64_t k = std::min(rows, n - begin);
        auto policy = run.trainer().call(&actors::Trainer::train_step, c.algo.mini_batches == 1 ? batch.policy : rows_of(batch.policy, begin, k));
        auto critic = critic_->call(&actors::Trainer::train_step, c.algo.mini_batches == 1 ? batch.critic : rows_of(batch.critic, begin, k));
        m = policy.get();
        v = critic.get();
        run.count_train(m);
      }
    }
    clock.lap(&StepTimes::train);
    const double kl = sampled_kl(samples, ref_logp);
    run.state().values["kl_coef"] = kl_.update(kl, n);
    run.sync_weights();
    clock.lap(&StepTimes::sync);
    for (const auto& [key, x] : v.values) m.values[key] = x;
    m.values["kl_coef"] = beta;         // the coefficient this step's rewards carried
    m.values["sampled_kl"] = kl;
    return run.record(samples, rewards, m, clock);
  }

  void save(Run&, const std::string& dir) override { critic_->call_sync(&actors::Trainer::save_checkpoint, dir + "/critic"); }

  void load(Run& run, const std::string& dir) override {
    critic_->call_sync(&actors::Trainer::set_optimizer, run.config().algo.critic_optim);
    critic_->call_sync(&actors::Trainer::load_checkpoint, dir + "/critic");
    const auto& s = run.state().values;
    if (auto it = s.find("kl_coef"); it != s.end()) kl_ = KlController(it->second, run.config().algo.kl_target, run.config().algo.kl_horizon);
  }

  void stop(Run& run) override {
    if (critic_) run.runtime().kill(*critic_);
  }

 private:
  KlController kl_;
  std::optional<ActorRef<actors::Trainer>> critic_;
};

}  // namespace

std::unique_ptr<Algorithm> detail::make_ppo(const RunConfig& config) { return std::make_unique<Ppo>(config); }

}  // namespace troupe::rl
