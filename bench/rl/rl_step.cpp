// rl_step: the cost of running GRPO as an actor graph. The same steps of the demo configuration run
// twice, interleaved step by step so that machine load drifts hit both alike:
//   troupe  Run::step(): four actors on their own threads, every call msgpack-encoded;
//   plain   the same actor classes as plain objects, called directly in one thread (no runtime).
// Both start from the same weights and draw the same prompts and seeds, so they do the same math
// (`same_math` checks the rewards and losses match step for step). Prints one JSON object:
// tokens/s, mean step seconds and their split per phase for each, and overhead_ratio =
// troupe step time / plain step time.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iostream>

#include <malloc.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "troupe/rl.hpp"

namespace {

using namespace troupe;
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The step loop of GRPO (rl/src/grpo.cpp), written out with direct calls.
class PlainLoop {
 public:
  explicit PlainLoop(const rl::RunConfig& c)
      : config_(c),
        task_(rl::make_task(c.task)),
        tokenizer_(task_->alphabet()),
        data_(rl::Dataset::make(*task_, c.train_size, c.heldout_size, c.seed)),
        trainer_(actors::TrainerConfig{c.policy, c.optim, c.trainer_threads}),
        rollout_(actors::RolloutConfig{c.policy, c.rollout_threads, true}),
        reference_(actors::ReferenceConfig{c.policy, "", c.reference_threads}),
        reward_(actors::RewardConfig{task_->verifier(), 0.0f}) {}

  rl::StepRecord step(rl::DataCursor cursor, std::int64_t step) {
    rl::StepRecord rec;
    const auto start = Clock::now();
    auto t = Clock::now();
    const auto problems = cursor.next(data_.train, std::size_t(config_.prompts_per_step));
    actors::GenerateRequest req{rl::encode_prompts(problems, tokenizer_), config_.group_size,
                                actors::SamplingParams{config_.temperature, config_.top_p, task_->max_answer_chars() + 1,
                                                       tokenizer_.eos_id(), rl::step_seed(config_.seed, step)},
                                {}, 0};
    const auto rb = rollout_.generate(std::move(req));
    rec.seconds.rollout = since(t), t = Clock::now();
    const auto scores = reward_.score(rl::score_items(problems, config_.group_size, rb, tokenizer_));
    rec.seconds.reward = since(t), t = Clock::now();
    const auto ref = reference_.logprobs(actors::LogprobRequest{rb.tokens, rb.attn_mask, config_.temperature});
    rec.seconds.reference = since(t), t = Clock::now();
    std::vector<float> rewards;
    for (auto& s : scores) rewards.push_back(s.reward);
    const auto m = trainer_.train_step(rl::grpo_batch(rb, ref, rl::group_advantages(rewards, config_.group_size), config_));
    rec.seconds.train = since(t), t = Clock::now();
    rollout_.update_weights(trainer_.weights());
    rec.seconds.sync = since(t);
    rec.seconds.total = since(start);
    double sum = 0;
    for (float r : rewards) sum += r;
    rec.reward_mean = sum / double(rewards.size());
    rec.loss = m.loss;
    rec.tokens_per_s = double(rb.generated_tokens) / rec.seconds.total;
    rec.response_tokens = double(rb.generated_tokens);
    return rec;
  }

 private:
  rl::RunConfig config_;
  std::unique_ptr<rl::Task> task_;
  actors::CharTokenizer tokenizer_;
  rl::Dataset data_;
  actors::Trainer trainer_;
  actors::RolloutEngine rollout_;
  actors::Reference reference_;
  actors::Reward reward_;
};

nlohmann::ordered_json summarise(const std::vector<rl::StepRecord>& recs) {
  rl::StepTimes mean;
  double tokens = 0;
  std::vector<double> totals;
  for (auto& r : recs) {
    mean.rollout += r.seconds.rollout, mean.reward += r.seconds.reward, mean.reference += r.seconds.reference;
    mean.train += r.seconds.train, mean.sync += r.seconds.sync, mean.total += r.seconds.total;
    tokens += r.tokens_per_s * r.seconds.total;
    totals.push_back(r.seconds.total);
  }
  const double n = double(recs.size());
  std::sort(totals.begin(), totals.end());
  auto ms = [&](double s) { return std::round(s / n * 1e5) / 100; };
  nlohmann::ordered_json j;
  j["step_ms"] = ms(mean.total);
  j["median_step_ms"] = std::round(totals[totals.size() / 2] * 1e5) / 100;
  j["tokens_per_s"] = std::round(tokens / mean.total);
  j["split_ms"] = {{"rollout", ms(mean.rollout)}, {"reward", ms(mean.reward)}, {"reference", ms(mean.reference)},
                   {"train", ms(mean.train)}, {"weight_sync", ms(mean.sync)}};
  return j;
}

}  // namespace

int main(int argc, char** argv) {
  // Each actor thread gets its own glibc malloc arena, and glibc trims those arenas eagerly: the
  // tensors a step allocates and frees then cost page faults on every step (measured: ~10 ms of a
  // 60 ms rollout phase). Keeping freed memory mapped makes actor threads allocate as fast as main.
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  auto rt = troupe::init(argc, argv);
  int steps = 40, warmup = 3;
  CLI::App app{"GRPO step: troupe actors vs a plain loop"};
  app.allow_extras();
  app.add_option("--steps", steps, "timed steps");
  app.add_option("--warmup", warmup, "untimed steps first");
  CLI11_PARSE(app, argc, argv);

  auto config = rl::RunConfig::demo();
  config.sft.steps = 0;   // the step's cost does not depend on what the weights know
  config.verbose = false;
  config.run_dir = (std::filesystem::temp_directory_path() / ("troupe_bench_rl_step-" + std::to_string(::getpid()))).string();
  std::filesystem::remove_all(config.run_dir);
  rl::Run grpo(rt, config);
  grpo.warm_start();
  PlainLoop plain(grpo.config());

  std::vector<rl::StepRecord> with_troupe, without;
  bool same_math = true;
  for (int i = 0; i < warmup + steps; ++i) {
    const auto cursor = grpo.state().cursor;
    const auto step = grpo.state().step;
    auto a = grpo.step();
    auto b = plain.step(cursor, step);
    same_math = same_math && a.reward_mean == b.reward_mean && a.loss == b.loss;
    if (i >= warmup) { with_troupe.push_back(a); without.push_back(b); }
  }
  nlohmann::ordered_json out;
  out["bench"] = "rl_step";
  out["config"] = {{"task", config.task}, {"layers", config.policy.layers}, {"d_model", config.policy.d_model},
                   {"prompts_per_step", config.prompts_per_step}, {"group_size", config.group_size},
                   {"threads_per_actor", config.trainer_threads}, {"steps", steps}};
  out["troupe"] = summarise(with_troupe);
  out["plain"] = summarise(without);
  out["overhead_ratio"] = std::round(out["troupe"]["step_ms"].get<double>() / out["plain"]["step_ms"].get<double>() * 1000) / 1000;
  out["median_overhead_ratio"] = std::round(out["troupe"]["median_step_ms"].get<double>() / out["plain"]["median_step_ms"].get<double>() * 1000) / 1000;
  out["same_math"] = same_math;
  std::filesystem::remove_all(config.run_dir);
  std::cout << out.dump() << std::endl;
  return 0;
}
