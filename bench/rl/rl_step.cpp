// rl_step: the cost of running an algorithm as an actor graph. For each of GRPO, PPO, DPO and
// reward-model training, the same steps of the demo configuration (64 prompts x 8 samples; 64
// pairs per reward-model step) run three ways, interleaved step by step so that machine load drifts
// hit all alike:
//   in_process  rl::Run's step (or, for the reward model, a Trainer actor called as
//               build/bin/reward_model calls it): every role an actor of this process, every call
//               msgpack-encoded; Run's calls are call_sync, so an idle actor's method runs on the
//               driver's thread (runtime/include/troupe/actor_ref.hpp);
//   workers     the same with worker processes (placement.worker_processes: trainer and rollout
//               colocated in one worker with the reference, PPO's critic in its own, the rule verifier
//               in the driver's process: rl/include/troupe/rl/run.hpp, PlacementConfig);
//   plain       the same actor classes as plain objects, called directly in one thread with the same
//               math (the algorithms' batch builders, algorithms.hpp): one plain libtorch loop.
// PPO runs with build/bin/ppo's settings. Every algorithm runs with OpenBLAS at one thread
// (--blas-threads, default 1: the one CPU each role holds), in every process while its runs last,
// the plain loop's steps included (actors/blas.hpp). OpenBLAS's own pool is as wide as the machine,
// in each process, and an idle pool thread spins ~0.1 s after each call: with the worker processes
// that was one process's pool spinning on the core another computed on (2026-12-04, four
// alternating pairs of 40 GRPO steps: workers' ratio 1.04-1.16 with the default pools, 0.96-1.04
// at one thread; the plain loop's step 81-105 ms and 101-105 ms).
// GRPO runs with beta 0.04 (the reference in its step, as this bench measured it before the demo
// dropped the KL term). All three start from the same SFT weights and draw the same prompts and seeds; `same_math` checks
// that their rewards and losses match step for step. Prints one JSON object with a key per
// algorithm: step_ms, median_step_ms, tokens_per_s, the split per phase of each way and actor_ms
// (the time inside the rollout's generate and the trainer's train steps, as they measured it), and
// overhead_ratio = in_process / plain and overhead_ratio_workers = workers / plain (by mean step
// time; median_* by median). The top-level "troupe", "plain" and "overhead_ratio" repeat GRPO's
// in-process figures under the keys this program printed before it covered the other algorithms.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <functional>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "troupe/rl.hpp"

namespace {

using namespace troupe;
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

struct Sample {   // one timed step of one way
  rl::StepTimes seconds;
  rl::ActorTimes actor;   // inside the rollout's and the trainer's methods
  double tokens = 0, reward_mean = 0, loss = 0;
};

Sample from_record(const rl::StepRecord& r) {
  return Sample{r.seconds, r.actor_seconds, r.tokens_per_s * r.seconds.total, r.reward_mean, r.loss};
}

// The roles of a run as plain objects, starting from the SFT weights at `sft`.
class PlainRoles {
 public:
  PlainRoles(const rl::RunConfig& c, const std::string& sft)
      : config_(c),
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

  Sample step(rl::DataCursor cursor, std::int64_t step) {
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
    const auto samples = rollout_.generate(std::move(req));
    out.actor.rollout = samples.seconds;
    lap(out.seconds.rollout);
    const auto rewards = reward_.score(rl::score_items(problems, config_.algo.group_size, samples, tokenizer_));
    lap(out.seconds.reward);
    if (config_.algo.name == "dpo") {   // the reference scores the pairs' rows only (rl/src/dpo.cpp)
      const auto pairs = rl::preference_pairs(rewards, config_.algo.group_size);
      std::optional<actors::TrainBatch> batch;
      if (!pairs.empty()) {
        batch = rl::dpo_batch(samples, pairs, config_.algo.dpo_beta, config_.algo.dpo_ipo, config_.algo.micro_batches);
        rl::add_reference_logprobs(*batch, reference_.logprobs(actors::LogprobRequest{batch->tokens, batch->attn_mask,
                                                                                      config_.algo.temperature}));
      }
      lap(out.seconds.reference);
      out.loss = batch ? train(*batch).loss : 0;
    } else {
      // GRPO with beta 0 asks no reference (rl/src/grpo.cpp); PPO always does.
      const bool need_ref = config_.algo.name != "grpo" || config_.algo.kl_coef != 0;
      const auto ref = need_ref ? reference_.logprobs(actors::LogprobRequest{samples.tokens, samples.attn_mask, config_.algo.temperature})
                                : TensorView{};
      std::optional<TensorView> values;
      if (critic_) values = critic_->head_values(actors::SequenceBatch{samples.tokens, samples.attn_mask}, "value");
      lap(out.seconds.reference);
      out.loss = update(samples, ref, values, rewards);
    }
    out.actor.train = train_seconds_;
    lap(out.seconds.train);
    rollout_.update_weights(trainer_.weights());
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
    auto m = trainer_.train_step(batch);
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
        critic_->train_step(c.algo.mini_batches == 1 ? b.critic : rl::rows_of(b.critic, begin, k));
      }
    }
    return loss;
  }

  rl::RunConfig config_;
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

nlohmann::ordered_json summarise(const std::vector<Sample>& samples) {
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

double ratio(const nlohmann::ordered_json& a, const nlohmann::ordered_json& b, const char* key) {
  return std::round(a[key].get<double>() / b[key].get<double>() * 1000) / 1000;
}

// The three ways' summaries and ratios of one algorithm.
nlohmann::ordered_json report(const std::vector<Sample>& in_process, const std::vector<Sample>& workers,
                              const std::vector<Sample>& plain, bool same_math, bool same_math_workers) {
  nlohmann::ordered_json j;
  j["in_process"] = summarise(in_process);
  j["workers"] = summarise(workers);
  j["plain"] = summarise(plain);
  j["overhead_ratio"] = ratio(j["in_process"], j["plain"], "step_ms");
  j["overhead_ratio_workers"] = ratio(j["workers"], j["plain"], "step_ms");
  j["median_overhead_ratio"] = ratio(j["in_process"], j["plain"], "median_step_ms");
  j["median_overhead_ratio_workers"] = ratio(j["workers"], j["plain"], "median_step_ms");
  j["same_math"] = same_math;
  j["same_math_workers"] = same_math_workers;
  return j;
}

bool same(const Sample& a, const Sample& b) { return a.reward_mean == b.reward_mean && a.loss == b.loss; }

// GRPO, PPO or DPO: an in-process rl::Run, a worker-process one and the plain loop, interleaved.
nlohmann::ordered_json bench_algorithm(Runtime& rt, rl::RunConfig config, const std::string& sft, int warmup, int steps) {
  rl::RunConfig workers_config = config;
  workers_config.placement.worker_processes = true;
  workers_config.run.run_dir += "-workers";
  rl::Run in_process(rt, config), workers(rt, workers_config);
  in_process.warm_start();   // no SFT steps: init_weights are the SFT weights
  workers.warm_start();
  PlainRoles plain(in_process.config(), sft);
  std::vector<Sample> a, b, c;
  bool same_math = true, same_math_workers = true;
  for (int i = 0; i < warmup + steps; ++i) {
    const auto cursor = in_process.state().cursor;
    const auto step = in_process.state().step;
    const Sample x = from_record(in_process.step()), y = from_record(workers.step()), z = plain.step(cursor, step);
    same_math = same_math && same(x, z);
    same_math_workers = same_math_workers && same(y, z);
    if (i >= warmup) { a.push_back(x); b.push_back(y); c.push_back(z); }
  }
  auto j = report(a, b, c, same_math, same_math_workers);
  j["blas_threads"] = config.placement.blas_threads;
  return j;
}

// Reward-model training (Bradley-Terry on pairs of a correct and a wrong answer, the SFT trunk with
// a score head): a Trainer actor on a thread, one in a worker process, and a plain Trainer.
nlohmann::ordered_json bench_reward_model(Runtime& rt, const rl::RunConfig& demo, const std::string& sft, int warmup, int steps,
                                          int pairs_per_step) {
  const auto task = rl::make_task(demo.task.spec);
  const actors::CharTokenizer tok(task->alphabet());
  actors::PolicyConfig model = demo.model.policy;
  model.vocab_size = tok.vocab_size();
  model.seed = demo.run.seed;
  model.scalar_heads = {"score"};
  const auto data = rl::Dataset::make(*task, demo.task.train_size, demo.task.heldout_size, demo.run.seed, demo.task.heldout_kind_share);
  actors::OptimConfig optim;
  optim.lr = 1e-4;
  optim.warmup_steps = 20;
  const actors::TrainerConfig tc{model, optim, demo.placement.trainer_threads, demo.placement.blas_threads};
  auto thread = rt.spawn<actors::Trainer>(Options{}.name("rm_thread"), tc);
  auto worker = rt.spawn<actors::Trainer>(Options{}.name("rm_worker").process(true), tc);
  actors::Trainer plain(tc);
  thread.call(&actors::Trainer::load_trunk, sft).get();
  worker.call(&actors::Trainer::load_trunk, sft).get();
  plain.load_trunk(sft);
  rl::DataCursor cursor{demo.run.seed ^ 0x7a1, 0, 0};
  std::vector<Sample> a, b, c;
  bool same_math = true, same_math_workers = true;
  auto timed = [](const std::function<actors::TrainMetrics()>& f) {
    const auto t = Clock::now();
    Sample s;
    const auto m = f();
    s.loss = m.loss;
    s.actor.train = m.seconds;
    s.tokens = double(m.tokens);   // trained tokens: tokens_per_s is the training throughput
    s.seconds.train = s.seconds.total = since(t);
    return s;
  };
  for (int i = 0; i < warmup + steps; ++i) {
    std::vector<rl::PreferencePair> pairs;   // the correct answer against a wrong one of the same format
    for (auto& p : cursor.next(data.train, std::size_t(pairs_per_step)))
      pairs.push_back(rl::PreferencePair{p, p.answer, std::to_string(std::stoll(p.answer) + 1)});
    const auto batch = rl::reward_model_batch(pairs, tok);
    const Sample x = timed([&] { return thread.call_sync(&actors::Trainer::train_step, batch); });
    const Sample y = timed([&] { return worker.call_sync(&actors::Trainer::train_step, batch); });
    const Sample z = timed([&] { return plain.train_step(batch); });
    same_math = same_math && same(x, z);
    same_math_workers = same_math_workers && same(y, z);
    if (i >= warmup) { a.push_back(x); b.push_back(y); c.push_back(z); }
  }
  rt.kill(thread);
  rt.kill(worker);
  auto j = report(a, b, c, same_math, same_math_workers);
  j["blas_threads"] = demo.placement.blas_threads;
  return j;
}

}  // namespace

int main(int argc, char** argv) {
  auto rt = troupe::init(argc, argv);   // a worker process of this bench returns never
  int steps = 20, warmup = 3, sft_steps = 100, rm_pairs = 64, blas = 1;
  std::string algorithms = "grpo,ppo,dpo,reward_model";
  CLI::App app{"one step of each algorithm: troupe actors (in-process and in worker processes) vs a plain loop"};
  app.allow_extras();
  app.add_option("--steps", steps, "timed steps per algorithm");
  app.add_option("--warmup", warmup, "untimed steps first");
  app.add_option("--sft-steps", sft_steps, "SFT steps of the shared start (DPO needs correct answers to pair)");
  app.add_option("--algorithms", algorithms, "comma-separated: grpo, ppo, dpo, reward_model");
  app.add_option("--blas-threads", blas,
                 "OpenBLAS threads for every algorithm (placement.blas_threads; default 1; 0: the default pool); -1: each its own (ppo 1)");
  CLI11_PARSE(app, argc, argv);
  std::vector<std::string> names;
  std::stringstream list(algorithms);
  for (std::string name; std::getline(list, name, ',');) {
    if (name != "grpo" && name != "ppo" && name != "dpo" && name != "reward_model") {
      std::cerr << "rl_step: unknown algorithm '" << name << "' (grpo, ppo, dpo, reward_model)\n";
      return 2;
    }
    names.push_back(name);
  }

  auto demo = rl::RunConfig::demo();
  const std::string dir = (std::filesystem::temp_directory_path() / ("troupe_bench_rl_step-" + std::to_string(::getpid()))).string();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  try {   // an actor that died, a worker that could not start: said, with the status, not an abort
    const std::string sft = dir + "/sft.safetensors";
    {   // the shared start: the demo's SFT warm start, shortened
      const auto task = rl::make_task(demo.task.spec);
      const actors::CharTokenizer tok(task->alphabet());
      actors::PolicyConfig policy = demo.model.policy;
      policy.vocab_size = tok.vocab_size();
      policy.seed = demo.run.seed;
      actors::Trainer trainer(actors::TrainerConfig{policy, demo.algo.sft.optim, demo.placement.trainer_threads});
      const auto data = rl::Dataset::make(*task, demo.task.train_size, demo.task.heldout_size, demo.run.seed, demo.task.heldout_kind_share);
      rl::DataCursor cursor{demo.run.seed ^ 0x5f7, 0, 0};
      for (int i = 0; i < sft_steps; ++i) trainer.train_step(rl::sft_batch(cursor.next(data.train, std::size_t(demo.algo.sft.batch_size)), tok));
      trainer.save_weights(sft);
    }
    nlohmann::ordered_json out;
    out["bench"] = "rl_step";
    out["config"] = {{"task", demo.task.spec}, {"layers", demo.model.policy.layers}, {"d_model", demo.model.policy.d_model},
                     {"prompts_per_step", demo.algo.prompts_per_step}, {"group_size", demo.algo.group_size}, {"rm_pairs_per_step", rm_pairs},
                     {"threads_per_actor", demo.placement.trainer_threads}, {"sft_steps", sft_steps}, {"steps", steps}};
    for (const auto& name : names) {
      if (name == "reward_model") {
        rl::RunConfig c = demo;
        if (blas >= 0) c.placement.blas_threads = blas;
        out[name] = bench_reward_model(rt, c, sft, warmup, steps, rm_pairs);
        continue;
      }
      rl::RunConfig c = demo;
      c.algo.kl_coef = 0.04;   // GRPO keeps the reference in its step, as in this bench's figures before the demo dropped it
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
      c.run.run_dir = dir + "/" + name;
      out[name] = bench_algorithm(rt, c, sft, warmup, steps);
    }
    if (out.contains("grpo")) {
      out["troupe"] = out["grpo"]["in_process"];
      out["plain"] = out["grpo"]["plain"];
      out["overhead_ratio"] = out["grpo"]["overhead_ratio"];
      out["median_overhead_ratio"] = out["grpo"]["median_overhead_ratio"];
      out["same_math"] = out["grpo"]["same_math"];
    }
    std::filesystem::remove_all(dir);
    std::cout << out.dump() << std::endl;
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "rl_step: " << e.what() << "\n";
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
    return 1;
  }
}
