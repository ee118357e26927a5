// examples/reward_model: a Bradley-Terry reward model (Ouyang et al. 2022, eq. 1) on the demo task,
// as actors. The same SFT warm start as build/bin/grpo; then preference pairs made from the task
// with both answers in its format (chosen: the correct answer; rejected: a wrong answer the SFT
// policy sampled); then the SFT trunk with a scalar "score" head, trained on the pairs by a Trainer
// with the "bradley_terry" objective and measured on held-out pairs by a RewardModel actor. Saves
// the model as safetensors (what `--reward model:PATH` will load) and prints, as its last stdout
// line, one JSON object: {"heldout_pair_acc", "steps", "seconds", "sft_seconds", "model", ...}.
#include <troupe/rl.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace rl = troupe::rl;
namespace ta = troupe::actors;

namespace {

struct Settings {
  std::uint64_t seed = 1;
  // Defaults: the configuration README measures (0.974 and 0.956 held-out pair accuracy, seeds 1 and 2, in 5-6.5 min).
  std::int32_t sft_steps = 300, trunk_sft_steps = 0, group = 8, steps = 12000, pairs_per_step = 64, eval_every = 2000, threads = 1, per_prompt = 8;
  std::size_t sample_prompts = 20000, heldout = 500;
  double heldout_kind_share = rl::kHeldoutKindShare;
  double lr = 1e-3, margin = 0.0, weight_decay = 0.0, lm_coef = 0.0;
  std::string run_dir = "runs/reward_model";
};

double since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

int main(int argc, char** argv) {
  auto rt = troupe::init(argc, argv);
  Settings s;
  // --config FILE, any key with --set algo.steps=3000, and a flag for every key (--steps 3000, ...).
  rl::ConfigSchema schema;
  schema.add("task.heldout_size", &s.heldout, "held-out prompts (their pairs measure the model)");
  schema.add("task.heldout_kind_share", &s.heldout_kind_share,
             "the held-out set takes at most this share of each kind of problem (the operands' digit counts); 1: no bound");
  schema.add("pairs.sample_prompts", &s.sample_prompts, "train prompts sampled for pairs (one pair per prompt at most)");
  schema.add("pairs.group", &s.group, "samples per prompt when looking for a wrong answer");
  schema.add("pairs.per_prompt", &s.per_prompt, "distinct wrong answers paired with each train prompt's right one (at most)");
  schema.add("algo.sft_steps", &s.sft_steps, "SFT warm-start steps of the policy that samples the rejected answers");
  schema.add("algo.trunk_sft_steps", &s.trunk_sft_steps,
             "SFT steps of the trunk the reward model starts from (0: the sampling policy's, algo.sft_steps)");
  schema.add("algo.steps", &s.steps, "reward-model optimizer steps");
  schema.add("algo.pairs_per_step", &s.pairs_per_step, "pairs per step");
  schema.add("algo.lr", &s.lr, "reward-model learning rate");
  schema.add("algo.margin", &s.margin, "Bradley-Terry margin (Touvron et al. 2023)");
  schema.add("algo.weight_decay", &s.weight_decay, "the reward model's decoupled weight decay (AdamW)");
  schema.add("algo.lm_coef", &s.lm_coef, "weight of the chosen answers' language-model loss beside Bradley-Terry (Yang et al. 2024); 0: none");
  schema.add("run.seed", &s.seed, "run seed: data, sampling, initial weights");
  schema.add("run.eval_every", &s.eval_every, "held-out evaluation period (steps)");
  schema.add("run.run_dir", &s.run_dir, "output directory: the model, the SFT policy, this configuration");
  schema.add("placement.threads", &s.threads, "libtorch threads of each compute actor");
  const std::map<std::string, std::string> flags{
      {"--seed", "run.seed"}, {"--sft-steps", "algo.sft_steps"}, {"--trunk-sft-steps", "algo.trunk_sft_steps"},
      {"--sample-prompts", "pairs.sample_prompts"}, {"--group", "pairs.group"}, {"--pairs-per-prompt", "pairs.per_prompt"},
      {"--steps", "algo.steps"}, {"--pairs-per-step", "algo.pairs_per_step"}, {"--lr", "algo.lr"}, {"--margin", "algo.margin"},
      {"--weight-decay", "algo.weight_decay"}, {"--lm-coef", "algo.lm_coef"}, {"--heldout-size", "task.heldout_size"},
      {"--eval-every", "run.eval_every"}, {"--threads", "placement.threads"}, {"--run-dir", "run.run_dir"}};
  try {
    if (!rl::parse_program_command_line("reward_model", schema, argc, argv, flags)) return 0;   // --help, --print-config
  } catch (const std::invalid_argument& e) {
    std::cerr << "reward_model: " << e.what() << "\n";
    return 2;
  }
  if (s.trunk_sft_steps != 0 && s.trunk_sft_steps < s.sft_steps) {
    std::cerr << "reward_model: --trunk-sft-steps " << s.trunk_sft_steps << " is below --sft-steps " << s.sft_steps
              << " (the trunk continues the sampler's SFT run)\n";
    return 2;
  }
  if (s.lm_coef < 0 || s.weight_decay < 0) {
    std::cerr << "reward_model: --lm-coef and --weight-decay must be >= 0\n";
    return 2;
  }
  for (const auto& [ok, rule] : {std::pair{s.steps >= 1, "--steps must be at least 1"},
                                  std::pair{s.pairs_per_step >= 1, "--pairs-per-step must be at least 1"},
                                  std::pair{s.eval_every >= 1, "--eval-every must be at least 1"},
                                  std::pair{s.group >= 2, "--group must be at least 2"},
                                  std::pair{s.per_prompt >= 1, "--pairs-per-prompt must be at least 1"},
                                  std::pair{s.sample_prompts >= 1, "--sample-prompts must be at least 1"},
                                  std::pair{s.heldout >= 1, "--heldout-size must be at least 1"},
                                  std::pair{s.sft_steps >= 0, "--sft-steps must be >= 0"},
                                  std::pair{s.threads >= 1, "--threads must be at least 1"}, std::pair{s.lr > 0, "--lr must be > 0"}}) {
    if (!ok) {
      std::cerr << "reward_model: " << rule << "\n";
      return 2;
    }
  }
  const auto start = std::chrono::steady_clock::now();
  try {
    std::filesystem::create_directories(s.run_dir);
    const std::string dir = std::filesystem::absolute(s.run_dir).string();
    std::ofstream(dir + "/config.toml") << schema.to_toml();   // the resolved configuration, beside the model
    const rl::RunConfig demo = rl::RunConfig::demo();
    const auto task = rl::make_task(demo.task.spec);
    const ta::CharTokenizer tok(task->alphabet());
    ta::PolicyConfig policy = demo.model.policy;
    policy.vocab_size = tok.vocab_size();
    policy.seed = s.seed;
    const rl::Dataset data = rl::Dataset::make(*task, demo.task.train_size, s.heldout, s.seed, s.heldout_kind_share);

    // 1. The SFT policy, as build/bin/grpo's warm start.
    auto sft = rt.spawn<ta::Trainer>(troupe::Options{}.name("sft"), ta::TrainerConfig{policy, demo.algo.sft.optim, s.threads});
    rl::DataCursor cursor{s.seed ^ 0x5f7, 0, 0};
    for (std::int32_t i = 0; i < s.sft_steps; ++i)
      sft.call_sync(&ta::Trainer::train_step, rl::sft_batch(cursor.next(data.train, std::size_t(demo.algo.sft.batch_size)), tok));
    const std::string sft_path = dir + "/sft.safetensors";
    sft.call_sync(&ta::Trainer::save_weights, sft_path);
    const double sft_seconds = since(start);

    // 2. Pairs: per prompt, the correct answer against a wrong, well-formed one the SFT policy sampled.
    auto sampler = rt.spawn<ta::RolloutEngine>(troupe::Options{}.name("sampler"), ta::RolloutConfig{policy, s.threads, true});
    sampler.call_sync(&ta::RolloutEngine::update_weights, sft.call_sync(&ta::Trainer::weights));
    auto verifier = rt.spawn<ta::Reward>(troupe::Options{}.name("verifier"), ta::RewardConfig{task->verifier(), 0.0f});
    auto pairs_of = [&](const std::vector<rl::Problem>& problems, std::uint64_t seed, std::int32_t per_prompt) {
      std::vector<rl::PreferencePair> pairs;
      for (std::size_t at = 0; at < problems.size(); at += 64) {
        const std::vector<rl::Problem> chunk(problems.begin() + long(at), problems.begin() + long(std::min(problems.size(), at + 64)));
        ta::GenerateRequest req{rl::encode_prompts(chunk, tok), s.group,
                                ta::SamplingParams{1.0f, 1.0f, task->max_answer_chars() + 1, tok.eos_id(), rl::step_seed(seed, long(at))},
                                {}, 0};
        const auto samples = sampler.call_sync(&ta::RolloutEngine::generate, std::move(req));
        const auto rewards = verifier.call_sync(&ta::Reward::score, rl::score_items(chunk, s.group, samples, tok));
        for (auto& p : rl::reward_model_pairs(chunk, s.group, samples, rewards, tok, per_prompt)) pairs.push_back(std::move(p));
      }
      return pairs;
    };
    std::vector<rl::Problem> prompts(data.train.begin(), data.train.begin() + long(std::min(s.sample_prompts, data.train.size())));
    auto train = pairs_of(prompts, s.seed ^ 0x7a1, s.per_prompt);
    const auto heldout = pairs_of(data.heldout, s.seed ^ 0x4e1, 1);   // one per prompt: each prompt weighs the same
    if (train.empty() || heldout.empty()) throw std::runtime_error("the SFT policy gave no wrong, well-formed answer to pair");

    // 3. The reward model: an SFT trunk (the sampler's, or the same run trained on to
    // --trunk-sft-steps) with a score head, trained with the Bradley-Terry loss.
    std::string trunk_path = sft_path;
    if (s.trunk_sft_steps > s.sft_steps) {
      for (std::int32_t i = s.sft_steps; i < s.trunk_sft_steps; ++i)
        sft.call_sync(&ta::Trainer::train_step, rl::sft_batch(cursor.next(data.train, std::size_t(demo.algo.sft.batch_size)), tok));
      trunk_path = dir + "/trunk.safetensors";
      sft.call_sync(&ta::Trainer::save_weights, trunk_path);
    }
    ta::PolicyConfig rm = policy;
    rm.scalar_heads = {"score"};
    ta::OptimConfig optim;
    optim.lr = s.lr;
    optim.warmup_steps = 20;
    optim.weight_decay = s.weight_decay;
    auto trainer = rt.spawn<ta::Trainer>(troupe::Options{}.name("rm_trainer"), ta::TrainerConfig{rm, optim, s.threads});
    trainer.call_sync(&ta::Trainer::load_trunk, trunk_path);
    auto scorer = rt.spawn<ta::RewardModel>(troupe::Options{}.name("reward_model"), ta::RewardModelConfig{rm, "", s.threads});
    const std::string model = dir + "/reward_model.safetensors";
    auto heldout_accuracy = [&] {
      trainer.call_sync(&ta::Trainer::save_weights, model);
      scorer.call_sync(&ta::RewardModel::load_weights, model);
      std::size_t right = 0;
      for (std::size_t at = 0; at < heldout.size(); at += 256) {
        const std::vector<rl::PreferencePair> part(heldout.begin() + long(at), heldout.begin() + long(std::min(heldout.size(), at + 256)));
        const auto b = rl::reward_model_batch(part, tok);
        const auto scores = scorer.call_sync(&ta::RewardModel::score, ta::SequenceBatch{b.tokens, b.attn_mask});
        for (std::size_t k = 0; k + 1 < scores.size(); k += 2) right += scores[k] > scores[k + 1] ? 1 : 0;
      }
      return double(right) / double(heldout.size());
    };
    std::mt19937_64 rng(s.seed);
    std::shuffle(train.begin(), train.end(), rng);
    std::size_t next = 0;
    double acc = 0;
    for (std::int32_t step = 1; step <= s.steps; ++step) {
      std::vector<rl::PreferencePair> batch;
      for (std::int32_t k = 0; k < s.pairs_per_step; ++k) {
        if (next == train.size()) { std::shuffle(train.begin(), train.end(), rng); next = 0; }
        batch.push_back(train[next++]);
      }
      auto b = rl::reward_model_batch(batch, tok, s.margin);
      if (s.lm_coef > 0) b.options["lm_coef"] = s.lm_coef;
      const auto m = trainer.call_sync(&ta::Trainer::train_step, std::move(b));
      if (step % s.eval_every == 0 || step == s.steps) {
        acc = heldout_accuracy();
        std::cerr << "step " << step << "/" << s.steps << "  loss " << m.loss << "  train pair acc "
                  << m.values.at("pair_accuracy") << "  held-out pair acc " << acc << "  " << since(start) << " s\n";
      }
    }
    nlohmann::ordered_json out;
    out["heldout_pair_acc"] = acc;
    out["steps"] = s.steps;
    out["seconds"] = std::round(since(start) * 10) / 10;
    out["sft_seconds"] = std::round(sft_seconds * 10) / 10;
    out["train_pairs"] = train.size();
    out["heldout_pairs"] = heldout.size();
    out["model"] = model;
    std::cout << out.dump() << std::endl;
  } catch (const std::exception& e) {
    std::cerr << "reward_model: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
