// The plain loop that build/bench/rl_step and build/bench/phase_threads time troupe against: an
// algorithm's roles as plain objects of one process, called directly with the same math as
// rl::Run's step (the algorithms' batch builders, algorithms.hpp), and how the timed steps of one
// way are summarised. Bench code, included by those two programs only.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "troupe/rl.hpp"

namespace troupe::bench_rl {

using Clock = std::chrono::steady_clock;
inline double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

struct Sample {   // one timed step of one way
  rl::StepTimes seconds;
  rl::ActorTimes actor;   // inside the rollout's and the trainer's methods
  double tokens = 0, reward_mean = 0, loss = 0;
};

// Whether two ways took the same step: the same rewards and the same loss, bit for bit.
inline bool same(const Sample& a, const Sample& b) { return a.reward_mean == b.reward_mean && a.loss == b.loss; }

// The role a phase of PlainRoles::step belongs to.
enum class Role { rollout, reference, trainer, critic };

// Where PlainRoles runs each phase of its step: a subclass may hand a role's phases to a thread.
class PhaseRunner {
 public:
  virtual ~PhaseRunner() = default;
  virtual void run(Role role, const std::function<void()>& phase) = 0;
};

// The roles of a run as plain objects, starting from the SFT weights at `sft`. Each phase of a
// step runs through `runner` (null: on the calling thread); the verifier's scoring stays on the
// calling thread, as in rl::Run, whose driver keeps the rule verifier.
class PlainRoles {
 public:
  PlainRoles(const rl::RunConfig& c, const std::string& sft, PhaseRunner* runner = nullptr)
      : config_(c),
        runner_(runner),
        task_(rl::make_task(c.task.spec)),
        tokenizer_(task_->alphabet()),
        data_(rl::Dataset::make(*task_, c.task.train_size, c.task.heldout_size, c.run.seed, c.task.heldout_kind_share)),
        trainer_(actors::TrainerConfig{c.model.policy, c.algo.sft.optim, c.placement.trainer_threads, c.placement.blas_threads}),
        rollout_(actors::RolloutConfig{c.model.policy, c.placement.rollout_threads, true, c.placement.blas_threads}),
        reference_(actors::ReferenceConfig{c.model.policy, "", c.placement.reference_threads, c.placement.blas_threads}),
        reward_(actors::RewardConfig{task_->verifier(), 0.0f}) {
    trainer_.load_trunk(sft);
    trainer_.set_optimizer(c.algo.optim);
    rollout_.update_weights(trainer_.weights());
    reference_.load_weights(sft);
    if (c.algo.name == "ppo") {
      actors::PolicyConfig model = c.model.policy;
      model.scalar_heads = {"value"};
      critic_.emplace(actors::TrainerConfig{model, c.algo.critic_optim, c.placement.trainer_threads, c.placement.blas_threads});
      critic_->load_trunk(sft);
    }
  }

  // Step `step` (0-based: its sampling seed) on the prompts `cursor` gives next (it advances).
  Sample step(rl::DataCursor& cursor, std::int64_t step) {
    Sample out;
    train_seconds_ = 0;
    const auto start = Clock::now();
    auto t = start;
    auto lap = [&t](double& slot) { slot = since(t); t = Clock::now(); };
    const auto problems = cursor.next(data_.train, std::size_t(config_.algo.prompts_per_step));
    actors::GenerateRequest req{rl::encode_prompts(problems, tokenizer_), config_.algo.group_size,
                                actors::SamplingParams{config_.algo.temperature, config_.algo.top_p, task_->max_answer_chars() + 1,
                                                       tokenizer_.eos_id(), rl::step_seed(config_.run.seed, step)},
                                {}, 0};
    actors::RolloutBatch samples;
    run(Role::rollout, [&] { samples = rollout_.generate(std::move(req)); });
    out.actor.rollout = samples.seconds;
    lap(out.seconds.rollout);
    const auto rewards = reward_.score(rl::score_items(problems, config_.algo.group_size, samples, tokenizer_));
    lap(out.seconds.reward);
    if (config_.algo.name == "dpo") {   // the reference scores the pairs' rows only (rl/src/dpo.cpp)
      const auto pairs = rl::preference_pairs(rewards, config_.algo.group_size);
      std::optional<actors::TrainBatch> batch;
      if (!pairs.empty()) {
        batch = rl::dpo_batch(samples, pairs, config_.algo.dpo_beta, config_.algo.dpo_ipo, config_.algo.micro_batches);
        run(Role::reference, [&] {
          rl::add_reference_logprobs(*batch, reference_.logprobs(actors::LogprobRequest{batch->tokens, batch->attn_mask,
                                                                                        batch->temperature}));
        });
      }
      lap(out.seconds.reference);
      out.loss = batch ? train(*batch).loss : 0;
    } else {
      // GRPO with beta 0 asks no reference (rl/src/grpo.cpp); PPO always does.
      const bool need_ref = config_.algo.name != "grpo" || config_.algo.kl_coef != 0;
      TensorView ref;
      if (need_ref)
        run(Role::reference, [&] { ref = reference_.logprobs(actors::LogprobRequest{samples.tokens, samples.attn_mask, config_.algo.temperature}); });
      std::optional<TensorView> values;
      if (critic_) run(Role::critic, [&] { values = critic_->head_values(actors::SequenceBatch{samples.tokens, samples.attn_mask}, "value"); });
      lap(out.seconds.reference);
      out.loss = update(samples, ref, values, rewards);
    }
    out.actor.train = train_seconds_;
    lap(out.seconds.train);
    run(Role::rollout, [&] { rollout_.update_weights(trainer_.weights()); });
    lap(out.seconds.sync);
    out.seconds.total = since(start);
    double sum = 0;
    for (auto& r : rewards) sum += r.reward;
    out.reward_mean = sum / double(rewards.size());
    out.tokens = double(samples.generated_tokens);
    return out;
  }

 private:
  // The trainer's train step, its time inside added to the step's (as rl::Run::train does).
  actors::TrainMetrics train(const actors::TrainBatch& batch) {
    actors::TrainMetrics m;
    run(Role::trainer, [&] { m = trainer_.train_step(batch); });
    train_seconds_ += m.seconds;
    return m;
  }

  // GRPO's or PPO's update, as its file in rl/src does it through the actors.
  double update(const actors::RolloutBatch& samples, const TensorView& ref, const std::optional<TensorView>& values,
                const std::vector<actors::RewardResult>& rewards) {
    const auto& c = config_;
    if (c.algo.name == "grpo") {
      std::vector<float> r;
      for (auto& x : rewards) r.push_back(x.reward);
      return train(rl::grpo_batch(samples, ref, rl::group_advantages(r, c.algo.group_size), c)).loss;
    }
    const auto b = rl::ppo_batches(samples, ref, *values, rewards, c.algo.kl_coef, c);
    const std::int64_t n = samples.tokens.shape[0], rows = (n + c.algo.mini_batches - 1) / c.algo.mini_batches;
    double loss = 0;
    for (std::int32_t epoch = 0; epoch < c.algo.updates_per_batch; ++epoch) {
      for (std::int64_t begin = 0; begin < n; begin += rows) {
        const std::int64_t k = std::min(rows, n - begin);
        loss = train(c.algo.mini_batches == 1 ? b.policy : rl::rows_of(b.policy, begin, k)).loss;
        run(Role::critic, [&] { critic_->train_step(c.algo.mini_batches == 1 ? b.critic : rl::rows_of(b.critic, begin, k)); });
      }
    }
    return loss;
  }

  void run(Role role, const std::function<void()>& phase) {
    if (runner_ != nullptr) runner_->run(role, phase); else phase();
  }

  rl::RunConfig config_;
  PhaseRunner* runner_;
  std::unique_ptr<rl::Task> task_;
  actors::CharTokenizer tokenizer_;
  rl::Dataset data_;
  actors::Trainer trainer_;
  actors::RolloutEngine rollout_;
  actors::Reference reference_;
  actors::Reward reward_;
  std::optional<actors::Trainer> critic_;
  double train_seconds_ = 0;   // inside train steps, this step
};

// One way's timed steps as the benches print them: step_ms and median_step_ms, tokens_per_s, the
// mean split per phase (split_ms) and the time inside the actors' methods (actor_ms).
inline nlohmann::ordered_json summarise(const std::vector<Sample>& samples) {
  rl::StepTimes mean;
  rl::ActorTimes actor;
  double tokens = 0;
  std::vector<double> totals;
  for (auto& s : samples) {
    mean.rollout += s.seconds.rollout, mean.reward += s.seconds.reward, mean.reference += s.seconds.reference;
    mean.train += s.seconds.train, mean.sync += s.seconds.sync, mean.total += s.seconds.total;
    actor.rollout += s.actor.rollout, actor.train += s.actor.train;
    tokens += s.tokens;
    totals.push_back(s.seconds.total);
  }
  const double n = double(samples.size());
  std::sort(totals.begin(), totals.end());
  auto ms = [&](double s) { return std::round(s / n * 1e5) / 100; };
  nlohmann::ordered_json j;
  j["step_ms"] = ms(mean.total);
  j["median_step_ms"] = std::round(totals[totals.size() / 2] * 1e5) / 100;
  j["tokens_per_s"] = std::round(tokens / std::max(1e-9, mean.total));
  j["split_ms"] = {{"rollout", ms(mean.rollout)}, {"reward", ms(mean.reward)}, {"reference", ms(mean.reference)},
                   {"train", ms(mean.train)}, {"weight_sync", ms(mean.sync)}};
  j["actor_ms"] = {{"rollout", ms(actor.rollout)}, {"train", ms(actor.train)}};
  return j;
}

// of / base, to three decimals (the ratios both benches print).
inline double ratio3(double of, double base) { return std::round(of / base * 1000) / 1000; }

// Into `j`, whose members `way` and `base` are summaries (summarise): `key`, way's mean step over
// base's, and "median_" + `key`, by median step, each to three decimals.
inline void put_ratio(nlohmann::ordered_json& j, const std::string& key, const char* way, const char* base) {
  const auto ratio = [&](const char* of) { return ratio3(j[way][of].get<double>(), j[base][of].get<double>()); };
  j[key] = ratio("step_ms");
  j["median_" + key] = ratio("median_step_ms");
}

// The flags both benches take for how long they run: --steps (timed, at least 1), --warmup
// (untimed steps first) and --sft-steps (of the shared start).
inline void add_length_options(CLI::App& app, int& steps, int& warmup, int& sft_steps) {
  app.add_option("--steps", steps, "timed steps per algorithm")->check(CLI::Range(1, 1 << 30));
  app.add_option("--warmup", warmup, "untimed steps first")->check(CLI::Range(0, 1 << 30));
  app.add_option("--sft-steps", sft_steps, "SFT steps of the shared start (DPO needs correct answers to pair)")
      ->check(CLI::Range(0, 1 << 30));
}

// The comma-separated names of `list`, each one of `known`; throws std::invalid_argument naming an
// unknown one and the known ones.
inline std::vector<std::string> algorithm_names(const std::string& list, const std::vector<std::string>& known) {
  std::vector<std::string> names;
  std::stringstream in(list);
  for (std::string name; std::getline(in, name, ',');) {
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      std::string all;
      for (const auto& k : known) all += (all.empty() ? "" : ", ") + k;
      throw std::invalid_argument("unknown algorithm '" + name + "' (" + all + ")");
    }
    names.push_back(name);
  }
  return names;
}

// A fresh directory of this process under the system's temporary one, removed with everything in
// it when this goes (however the bench ends, short of a kill).
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& bench)
      : path_((std::filesystem::temp_directory_path() / ("troupe_bench_" + bench + "-" + std::to_string(::getpid()))).string()) {
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// The configuration each bench runs `name` (grpo, ppo or dpo) with: the demo's, in build/bin/ppo's
// and dpo's settings, GRPO with beta 0.04 (the reference in its step, as these benches measured it
// before the demo dropped the KL term), from the SFT weights at `sft`, OpenBLAS at `blas` threads
// (< 0: the algorithm's own setting).
inline rl::RunConfig bench_config(const rl::RunConfig& demo, const std::string& name, int blas, const std::string& sft,
                                  const std::string& run_dir) {
  rl::RunConfig c = demo;
  c.algo.kl_coef = 0.04;
  if (name == "ppo" || name == "dpo") {   // build/bin/ppo's and build/bin/dpo's settings (examples/)
    c.algo.name = name;
    if (name == "ppo") {
      c.algo.kl_coef = 0.02, c.algo.updates_per_batch = 2, c.algo.mini_batches = 2, c.algo.optim.lr = 5e-4;
      c.algo.critic_optim.lr = 1e-3, c.algo.critic_optim.warmup_steps = 20, c.placement.blas_threads = 1;
    }
  }
  if (blas >= 0) c.placement.blas_threads = blas;
  c.model.init_weights = sft;
  c.algo.sft.steps = 0;
  c.run.verbose = false;
  c.run.run_dir = run_dir;
  return c;
}

// The demo's SFT warm start, `steps` steps, saved at `path`: the shared start of every way.
inline void save_sft_start(const rl::RunConfig& demo, int steps, const std::string& path) {
  const auto task = rl::make_task(demo.task.spec);
  const actors::CharTokenizer tok(task->alphabet());
  actors::PolicyConfig policy = demo.model.policy;
  policy.vocab_size = tok.vocab_size();
  policy.seed = demo.run.seed;
  actors::Trainer trainer(actors::TrainerConfig{policy, demo.algo.sft.optim, demo.placement.trainer_threads});
  const auto data = rl::Dataset::make(*task, demo.task.train_size, demo.task.heldout_size, demo.run.seed, demo.task.heldout_kind_share);
  rl::DataCursor cursor{demo.run.seed ^ 0x5f7, 0, 0};
  for (int i = 0; i < steps; ++i) trainer.train_step(rl::sft_batch(cursor.next(data.train, std::size_t(demo.algo.sft.batch_size)), tok));
  trainer.save_weights(path);
}

}  // namespace troupe::bench_rl
