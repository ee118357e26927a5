#include "troupe/rl/grpo.hpp"

#include <cstdlib>

#include "troupe/rl/config.hpp"

#include <chrono>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "troupe/actors/tokenizer.hpp"
#include "troupe/rl/advantages.hpp"
#include "troupe/rl/batches.hpp"
#include "troupe/rl/objectives.hpp"

namespace troupe::rl {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// SplitMix64: decorrelates the per-step sampling seeds derived from (run seed, step).
std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

std::string sft_weights_path(const GrpoConfig& c) { return c.run_dir + "/sft.safetensors"; }

}  // namespace

std::uint64_t step_seed(std::uint64_t run_seed, std::int64_t step) { return mix(run_seed ^ mix(std::uint64_t(step))); }

actors::TrainBatch grpo_batch(const actors::RolloutBatch& rollout, const TensorView& ref_logp,
                              const std::vector<float>& advantages, const GrpoConfig& config) {
  actors::TrainBatch b;
  b.objective = config.objective;
  b.tokens = rollout.tokens;
  b.attn_mask = rollout.attn_mask;
  b.loss_mask = rollout.response_mask;
  b.inputs = {{"ref_logp", ref_logp}, {"advantages", vector_view(advantages)}};
  if (config.updates_per_batch > 1) b.inputs["old_logp"] = rollout.logprobs;   // the ratio to the sampling policy
  b.options = {{"clip_eps", config.clip_eps}, {"kl_coef", config.kl_coef}};
  b.temperature = config.temperature;
  b.micro_batches = config.micro_batches;
  b.row_group = config.group_size;   // a prompt's samples stay in one micro-batch
  return b;
}

GrpoConfig GrpoConfig::demo() {
  GrpoConfig c;
  c.task = "addition:1-2";
  c.policy.context = 16;
  c.policy.layers = 2;
  c.policy.d_model = 64;
  c.policy.heads = 4;
  c.sft.steps = 300;          // ~25% held-out accuracy: a start with reward to climb from
  c.sft.batch_size = 64;
  c.sft.optim.lr = 3e-3;
  c.sft.optim.warmup_steps = 20;
  c.steps = 500;
  c.prompts_per_step = 64;
  c.group_size = 8;
  c.optim.lr = 3e-4;
  c.kl_coef = 0.04;
  c.eval_every = 20;
  return c;
}

Grpo::Grpo(Runtime& rt, GrpoConfig config) : rt_(rt), config_(std::move(config)) {
  register_grpo_objective();
  if (config_.algorithm != "grpo" && config_.algorithm != "dpo" && config_.algorithm != "ppo") {
    throw std::invalid_argument("unknown algorithm '" + config_.algorithm + "' (grpo, ppo or dpo)");
  }
  if (config_.mini_batches < 1) throw std::invalid_argument("mini_batches must be at least 1");
  if (!config_.critic_init.empty() && !std::filesystem::is_regular_file(config_.critic_init))
    throw std::invalid_argument("critic init file '" + config_.critic_init + "' does not exist");
  advantage_ = find_advantage_estimator(config_.advantage);   // an unknown name fails here, not at step 1
  rollouts_ = RolloutRange::parse(config_.rollouts);
  if (config_.reward != "rule" && config_.reward.rfind("model:", 0) != 0)
    throw std::invalid_argument("unknown reward '" + config_.reward + "' (rule, or model:PATH)");
  if (config_.reward.rfind("model:", 0) == 0 && !std::filesystem::is_regular_file(config_.reward.substr(6)))
    throw std::invalid_argument("reward model file '" + config_.reward.substr(6) + "' does not exist");
  task_ = make_task(config_.task);
  tokenizer_ = std::make_unique<actors::CharTokenizer>(task_->alphabet());
  config_.policy.vocab_size = tokenizer_->vocab_size();
  config_.policy.seed = config_.seed;
  data_ = Dataset::make(*task_, config_.train_size, config_.heldout_size, config_.seed);
  state_.seed = config_.seed;
  state_.cursor.seed = mix(config_.seed ^ 0xc0ffee);
  config_.run_dir = std::filesystem::absolute(config_.run_dir).string();
  std::filesystem::create_directories(config_.run_dir);
  {   // the resolved configuration, next to the metrics
    GrpoConfig resolved = config_;
    std::ofstream(config_.run_dir + "/config.toml") << grpo_config_schema(resolved).to_toml();
  }
  spawn_actors();
}

void Grpo::spawn_actors() {
  Options trainer = Options{}.name("trainer"), rollout = Options{}.name("rollout"),
          reference = Options{}.name("reference"), reward = Options{}.name("reward"), weights = Options{}.name("weights");
  if (config_.worker_processes) {
    const int cpus = std::max(config_.trainer_threads, config_.rollout_threads);
    group_ = rt_.placement_group({"CPU=" + std::to_string(cpus)}, "PACK", "grpo");
    if (!group_->ready(std::chrono::seconds(60))) throw std::runtime_error("grpo: no node has room for the trainer's bundle");
    trainer.bundle(*group_, 0, /*colocate=*/true);
    rollout.bundle(*group_, 0, /*colocate=*/true);
    weights.bundle(*group_, 0, /*colocate=*/true);   // with the trainer: publishing is one copy, pulling none
    reference.process(true);
    reward.process(true);
  }
  trainer_ = rt_.spawn<actors::Trainer>(trainer, actors::TrainerConfig{config_.policy, config_.sft.optim, config_.trainer_threads});
  rollout_ = rt_.spawn<actors::RolloutEngine>(rollout, actors::RolloutConfig{config_.policy, config_.rollout_threads, true});
  reference_ = rt_.spawn<actors::Reference>(reference, actors::ReferenceConfig{config_.policy, "", config_.reference_threads});
  reward_ = rt_.spawn<actors::Reward>(reward, actors::RewardConfig{task_->verifier(), 0.0f});
  if (config_.algorithm == "ppo") {   // the critic: the policy's architecture with a value head
    actors::PolicyConfig critic = config_.policy;
    critic.scalar_heads = {"value"};
    critic_ = rt_.spawn<actors::Trainer>(Options{reference}.name("critic"),
                                         actors::TrainerConfig{critic, config_.critic_optim, config_.trainer_threads});
  }
  if (config_.reward.rfind("model:", 0) == 0) {   // the run's architecture with a score head
    actors::PolicyConfig rm = config_.policy;
    rm.scalar_heads = {"score"};
    const std::string path = std::filesystem::absolute(config_.reward.substr(6)).string();
    reward_model_ = rt_.spawn<actors::RewardModel>(Options{reward}.name("reward_model"),
                                                   actors::RewardModelConfig{rm, path, config_.reference_threads});
  }
  weights_ = rt_.spawn<WeightStore>(weights);
  // Engines 1.. run in worker processes of their own wherever the head finds room.
  const Options member = Options{}.process(true).cpus(config_.rollout_threads);
  pool_ = std::make_unique<RolloutPool>(rt_, rollout_, weights_, rollouts_, member,
                                        actors::RolloutConfig{config_.policy, config_.rollout_threads, true});
}

Grpo::~Grpo() {
  pool_.reset();
  rt_.kill(trainer_);
  rt_.kill(rollout_);
  rt_.kill(reference_);
  rt_.kill(reward_);
  if (reward_model_) rt_.kill(*reward_model_);
  if (critic_) rt_.kill(*critic_);
  rt_.kill(weights_);
  if (group_) group_->remove();
}

// --- warm start and evaluation ---------------------------------------------------------------------

void Grpo::warm_start() {
  DataCursor cursor{mix(config_.seed ^ 0x5f7), 0, 0};
  ProgressLine progress(config_.sft.steps, 50, config_.verbose);
  for (std::int32_t s = 1; s <= config_.sft.steps; ++s) {
    auto batch = sft_batch(cursor.next(data_.train, std::size_t(config_.sft.batch_size)), *tokenizer_);
    auto m = trainer_.call(&actors::Trainer::train_step, std::move(batch)).get();
    if (s % 50 == 0 || s == config_.sft.steps)
      progress.message("sft step " + std::to_string(s) + "/" + std::to_string(config_.sft.steps) +
                       "  nll " + std::to_string(m.values["nll"]));
  }
  trainer_.call(&actors::Trainer::save_weights, sft_weights_path(config_)).get();
  trainer_.call(&actors::Trainer::set_optimizer, config_.optim).get();
  if (critic_ && config_.critic_init.empty()) {
    critic_->call(&actors::Trainer::load_trunk, sft_weights_path(config_)).get();   // the SFT trunk, a fresh value head
  } else if (critic_) {   // a reward model's trunk, its score head as the value head
    critic_->call(&actors::Trainer::load_trunk_as, config_.critic_init, std::string("score"), std::string("value")).get();
  }
  sync_weights();
  start_reference();
}

void Grpo::start_reference() { reference_.call(&actors::Reference::load_weights, sft_weights_path(config_)).get(); }

EvalResult Grpo::evaluate() {
  actors::GenerateRequest req;
  req.prompts = encode_prompts(data_.heldout, *tokenizer_);
  req.samples_per_prompt = 1;
  req.sampling = actors::SamplingParams{0.0f, 1.0f, std::int32_t(task_->max_answer_chars() + 1), tokenizer_->eos_id(), 0};
  auto rollout = rollout_.call(&actors::RolloutEngine::generate, std::move(req)).get();
  auto results = reward_.call(&actors::Reward::score, score_items(data_.heldout, 1, rollout, *tokenizer_)).get();
  EvalResult e;
  e.problems = std::int64_t(results.size());
  for (auto& r : results) { e.accuracy += r.correct; e.format_ok += r.format_ok; }
  if (e.problems > 0) { e.accuracy /= double(e.problems); e.format_ok /= double(e.problems); }
  return e;
}

// --- one GRPO step ----------------------------------------------------------------------------------

std::vector<Problem> Grpo::next_prompts() {
  return state_.cursor.next(data_.train, std::size_t(config_.prompts_per_step));
}

// The step's prompts split across the engines by cost; every sample keyed by (run seed, step, its
// prompt's index, its index), so the split changes nothing.
actors::RolloutBatch Grpo::generate(const std::vector<Problem>& problems) {
  actors::GenerateRequest req;
  req.prompts = encode_prompts(problems, *tokenizer_);
  req.samples_per_prompt = config_.group_size;
  req.sampling = actors::SamplingParams{config_.temperature, config_.top_p, std::int32_t(task_->max_answer_chars() + 1),
                                        tokenizer_->eos_id(), step_seed(config_.seed, state_.step)};
  return pool_->generate(req, &engines_);
}

std::vector<actors::RewardResult> Grpo::score(const std::vector<Problem>& problems, const actors::RolloutBatch& rollout) {
  auto verdicts = reward_.call(&actors::Reward::score, score_items(problems, config_.group_size, rollout, *tokenizer_));
  if (!reward_model_) return verdicts.get();
  // The learned reward trains the policy; the verifier's verdicts stay for format and accuracy.
  auto scores = reward_model_->call(&actors::RewardModel::score, actors::SequenceBatch{rollout.tokens, rollout.attn_mask}).get();
  auto results = verdicts.get();
  if (scores.size() != results.size()) throw std::runtime_error("the reward model scored " + std::to_string(scores.size()) + " of " +
                                                                std::to_string(results.size()) + " samples");
  for (std::size_t i = 0; i < results.size(); ++i) results[i].reward = scores[i];
  return results;
}

TensorView Grpo::reference_logprobs(const actors::RolloutBatch& rollout) {
  return reference_.call(&actors::Reference::logprobs, actors::LogprobRequest{rollout.tokens, rollout.attn_mask, config_.temperature}).get();
}

std::vector<float> Grpo::advantages(const std::vector<actors::RewardResult>& rewards) {
  AdvantageInput in;
  in.rewards.reserve(rewards.size());
  for (auto& x : rewards) in.rewards.push_back(x.reward);
  in.group_size = config_.group_size;
  AdvantageOutput out = advantage_(in);
  if (out.per_token || out.advantages.size() != in.rewards.size()) {
    throw std::invalid_argument("advantage estimator '" + config_.advantage + "' does not give one advantage per sample");
  }
  return std::move(out.advantages);
}

actors::TrainMetrics Grpo::update(const actors::RolloutBatch& rollout, const TensorView& ref_logp,
                                  const std::vector<float>& advantages) {
  const actors::TrainBatch b = grpo_batch(rollout, ref_logp, advantages, config_);
  actors::TrainMetrics m;
  for (std::int32_t i = 0; i < std::max(1, config_.updates_per_batch); ++i)
    m = trainer_.call(&actors::Trainer::train_step, b).get();
  return m;
}

// PPO (Ouyang et al. 2022's RLHF recipe, the token-level form of OpenRLHF and verl): the critic's
// values, per-token rewards (the outcome at the last response token, -kl_coef * (logp_old -
// logp_ref) on every response token), GAE advantages (whitened) and returns, then
// updates_per_batch epochs of mini_batches optimizer steps each for the policy and the critic,
// which train side by side.
actors::TrainMetrics Grpo::ppo_update(const actors::RolloutBatch& rollout, const TensorView& ref_logp,
                                      const std::vector<actors::RewardResult>& rewards) {
  const TensorView values = critic_->call(&actors::Trainer::head_values, actors::SequenceBatch{rollout.tokens, rollout.attn_mask},
                                          std::string("value")).get();
  const std::int64_t n = rollout.tokens.shape[0], t = rollout.tokens.shape[1];
  AdvantageInput in;
  in.tokens = t;
  in.token_rewards.assign(std::size_t(n * t), 0.0f);
  in.values.assign(values.data_as<float>(), values.data_as<float>() + n * t);
  in.mask.assign(std::size_t(n * t), 0);
  const bool* resp = rollout.response_mask.data_as<bool>();
  const float* old = rollout.logprobs.data_as<float>();
  const float* ref = ref_logp.data_as<float>();
  for (std::int64_t r = 0; r < n; ++r) {
    std::int64_t last = -1;
    for (std::int64_t c = 0; c < t; ++c) {
      const std::size_t i = std::size_t(r * t + c);
      if (!resp[i]) continue;
      in.mask[i] = 1;
      in.token_rewards[i] = float(-config_.kl_coef * (double(old[i]) - double(ref[i])));
      last = c;
    }
    if (last >= 0) in.token_rewards[std::size_t(r * t + last)] += rewards[std::size_t(r)].reward;
  }
  in.options = {{"gamma", config_.gae_gamma}, {"lambda", config_.gae_lambda}, {"whiten", 1.0}};
  const AdvantageOutput gae = find_advantage_estimator("gae")(in);
  auto as_view = [&](const std::vector<float>& x) {
    TensorView v = TensorView::empty(DType::F32, {n, t});
    std::copy(x.begin(), x.end(), v.data_as<float>());
    return v;
  };
  actors::TrainBatch policy;
  policy.objective = "ppo";
  policy.tokens = rollout.tokens;
  policy.attn_mask = rollout.attn_mask;
  policy.loss_mask = rollout.response_mask;
  policy.inputs = {{"old_logp", rollout.logprobs}, {"advantages", as_view(gae.advantages)}, {"ref_logp", ref_logp}};
  policy.options = {{"clip_eps", config_.clip_eps}};
  policy.temperature = config_.temperature;
  policy.micro_batches = config_.micro_batches;
  actors::TrainBatch critic = policy;
  critic.objective = "value";
  critic.inputs = {{"old_values", values}, {"returns", as_view(gae.returns)}};
  critic.options = {{"value_clip", config_.value_clip}};
  actors::TrainMetrics m, v;
  const std::int64_t rows = (n + config_.mini_batches - 1) / config_.mini_batches;
  for (std::int32_t epoch = 0; epoch < std::max(1, config_.updates_per_batch); ++epoch) {
    for (std::int64_t begin = 0; begin < n; begin += rows) {
      const std::int64_t k = std::min(rows, n - begin);
      auto pf = trainer_.call(&actors::Trainer::train_step, config_.mini_batches == 1 ? policy : rows_of(policy, begin, k));
      auto vf = critic_->call(&actors::Trainer::train_step, config_.mini_batches == 1 ? critic : rows_of(critic, begin, k));
      m = pf.get();
      v = vf.get();
    }
  }
  for (const auto& [key, x] : v.values) m.values[key] = x;
  return m;
}

// Online DPO: this step's samples as preference pairs (a prompt with a correct and a wrong answer
// gives one), against the reference. A step without a pair changes nothing.
actors::TrainMetrics Grpo::dpo_update(const actors::RolloutBatch& rollout, const TensorView& ref_logp,
                                      const std::vector<actors::RewardResult>& rewards) {
  const auto pairs = preference_pairs(rewards, config_.group_size);
  actors::TrainMetrics m;
  if (pairs.empty()) {
    m.policy_version = state_.policy_version;
    return m;
  }
  const actors::TrainBatch b = dpo_batch(rollout, ref_logp, pairs, config_.dpo_beta, config_.dpo_ipo, config_.micro_batches);
  for (std::int32_t i = 0; i < std::max(1, config_.updates_per_batch); ++i)
    m = trainer_.call(&actors::Trainer::train_step, b).get();
  m.values["pairs"] = double(pairs.size() / 2);
  return m;
}

// Through the versioned weight store: the trainer publishes, the rollout engines pull (engine 0,
// colocated: no copy beyond the publish; the others: the mapped file or the chain).
void Grpo::sync_weights() {
  trainer_.call(&actors::Trainer::publish_to, weights_).get();
  state_.policy_version = pool_->pull_weights();
}

namespace {

// FNV-1a over the step's token ids and response mask: two runs drew the same samples iff equal
// (up to collisions).
std::string samples_digest(const actors::RolloutBatch& b) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  auto eat = [&h](const void* data, std::size_t bytes) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (std::size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  };
  for (const TensorView* v : {&b.tokens, &b.response_mask}) {
    if (!v->is_contiguous()) return "";
    eat(v->shape.data(), v->shape.size() * sizeof(std::int64_t));
    eat(v->data, v->nbytes());
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return hex;
}

// The log line of one step: reward statistics, the trainer's metrics, throughput.
StepRecord step_record(const actors::RolloutBatch& rollout, const std::vector<actors::RewardResult>& rewards,
                       const actors::TrainMetrics& m) {
  StepRecord rec;
  rec.policy_version = m.policy_version;
  rec.sample_version = rollout.policy_version.empty() ? 0 : rollout.policy_version.front();
  double sum = 0, sq = 0, fmt = 0;
  for (auto& r : rewards) { sum += r.reward; sq += double(r.reward) * r.reward; fmt += r.format_ok; }
  const double n = double(std::max<std::size_t>(1, rewards.size()));
  rec.reward_mean = sum / n;
  rec.reward_std = std::sqrt(std::max(0.0, sq / n - rec.reward_mean * rec.reward_mean));
  rec.format_ok = fmt / n;
  rec.response_tokens = double(rollout.generated_tokens) / n;
  auto value = [&](const char* k) { return m.values.count(k) ? m.values.at(k) : 0.0; };
  rec.loss = m.loss;
  rec.pg_loss = value("pg_loss");
  rec.kl = value("kl");
  rec.clip_fraction = value("clip_fraction");
  rec.values = m.values;
  rec.entropy = m.entropy;
  rec.grad_norm = m.grad_norm;
  rec.lr = m.lr;
  return rec;
}

}  // namespace

// Algorithm 1 of the GRPO paper, one iteration: sample G outputs per prompt, score them, compute
// group-relative advantages, update the policy (mu times), then hand the new weights to the sampler.
StepRecord Grpo::step() {
  StepTimes time;
  const auto start = Clock::now();
  auto t = start;
  auto lap = [&t](double& slot) { slot = since(t); t = Clock::now(); };
  const auto problems = next_prompts();
  const auto rollout = generate(problems);
  lap(time.rollout);
  const auto rewards = score(problems, rollout);
  lap(time.reward);
  const auto ref_logp = reference_logprobs(rollout);
  lap(time.reference);
  const auto metrics = config_.algorithm == "dpo"   ? dpo_update(rollout, ref_logp, rewards)
                       : config_.algorithm == "ppo" ? ppo_update(rollout, ref_logp, rewards)
                                                    : update(rollout, ref_logp, advantages(rewards));
  lap(time.train);
  sync_weights();
  lap(time.sync);
  time.total = since(start);
  ++state_.step;
  StepRecord rec = step_record(rollout, rewards, metrics);
  rec.step = state_.step;
  rec.rollout_engines = engines_;
  rec.samples_digest = samples_digest(rollout);
  rec.seconds = time;
  rec.tokens_per_s = double(rollout.generated_tokens) / std::max(1e-9, time.total);
  return rec;
}

std::string summary_json_line(const RunSummary& s) {
  auto tenth = [](double x) { return std::round(x * 10) / 10; };
  nlohmann::ordered_json out;
  out["sft_heldout_acc"] = s.sft_heldout_acc;
  out["final_heldout_acc"] = s.final_heldout_acc;
  out["sft_heldout_format"] = s.sft_heldout_format;
  out["final_heldout_format"] = s.final_heldout_format;
  out["steps"] = s.steps;
  out["seconds"] = tenth(s.seconds);
  out["sft_seconds"] = tenth(s.sft_seconds);
  out["grpo_seconds"] = tenth(s.grpo_seconds);
  out["metrics"] = s.metrics_path;
  out["plot"] = s.plot_path;
  out["checkpoint"] = s.checkpoint;
  out["resumed"] = s.resumed;
  return out.dump();
}

GrpoConfig for_job_attempt(GrpoConfig config) {
  const char* attempt = std::getenv("TROUPE_JOB_ATTEMPT");
  if (attempt != nullptr && std::atoi(attempt) > 1 && !config.resume) {
    config.resume = true;
    std::cerr << "attempt " << attempt << " of job " << (std::getenv("TROUPE_JOB_ID") ? std::getenv("TROUPE_JOB_ID") : "?")
              << ": resuming from the newest checkpoint in " << config.run_dir << " (if any)" << std::endl;
  }
  return config;
}

int run_and_report(const std::string& program, Runtime& rt, const GrpoConfig& config) {
  RunSummary s;
  try {
    Grpo driver(rt, for_job_attempt(config));
    s = driver.run();
  } catch (const std::exception& e) {
    std::cerr << program << ": " << e.what() << "\n";
    return 1;
  }
  std::cout << summary_json_line(s) << std::endl;
  return 0;
}

// --- checkpoints --------------------------------------------------------------------------------------

std::string Grpo::save_checkpoint() {
  const std::string dir = checkpoint_dir(config_.run_dir, state_.step), staging = dir + ".tmp";
  std::filesystem::remove_all(staging);
  std::filesystem::create_directories(staging);
  trainer_.call(&actors::Trainer::save_checkpoint, staging).get();
  if (critic_) critic_->call(&actors::Trainer::save_checkpoint, staging + "/critic").get();
  save_run_state(staging, state_);
  publish_checkpoint(staging, dir);
  return dir;
}

bool Grpo::resume() {
  auto dir = latest_checkpoint(config_.run_dir);
  if (!dir) return false;
  state_ = load_run_state(*dir);
  trainer_.call(&actors::Trainer::set_optimizer, config_.optim).get();
  trainer_.call(&actors::Trainer::load_checkpoint, *dir).get();
  if (critic_) {
    critic_->call(&actors::Trainer::set_optimizer, config_.critic_optim).get();
    critic_->call(&actors::Trainer::load_checkpoint, *dir + "/critic").get();
  }
  sync_weights();
  start_reference();
  return true;
}

actors::Weights Grpo::policy_weights() { return trainer_.call(&actors::Trainer::weights).get(); }

// --- the whole run ---------------------------------------------------------------------------------------

RunSummary Grpo::begin_run() {
  RunSummary sum;
  sum.run_dir = config_.run_dir;
  sum.metrics_path = sum.run_dir + "/metrics.jsonl";
  sum.resumed = config_.resume && resume();
  if (!sum.resumed) {
    warm_start();
    EvalResult e = evaluate();
    state_.sft_heldout_acc = e.accuracy;
    state_.sft_heldout_format = e.format_ok;
  }
  sum.sft_heldout_acc = state_.sft_heldout_acc;
  sum.sft_heldout_format = state_.sft_heldout_format;
  return sum;
}

void Grpo::evaluate_into(StepRecord& rec, RunSummary& sum) {
  const auto t = Clock::now();
  EvalResult e = evaluate();
  rec.heldout_acc = sum.final_heldout_acc = e.accuracy;
  rec.heldout_format = sum.final_heldout_format = e.format_ok;
  rec.seconds.eval = since(t);
}

void Grpo::end_run(RunSummary& sum, std::int32_t steps_here) {
  if (!sum.stopped_early && steps_here == 0) {   // resumed at the last step: evaluate what was restored
    StepRecord unused;
    evaluate_into(unused, sum);
  }
  sum.checkpoint = std::filesystem::absolute(save_checkpoint()).string();
  sum.steps = state_.step;
  if (sum.stopped_early) return;
  std::string error;
  const std::string png = sum.run_dir + "/reward.png";
  if (plot_metrics(sum.metrics_path, png, "GRPO on " + config_.task, sum.sft_heldout_acc, &error)) sum.plot_path = png;
  else ProgressLine(0, 1, config_.verbose).message("no plot: " + error);
}

RunSummary Grpo::run() {
  const auto start = Clock::now();
  RunSummary sum = begin_run();
  sum.sft_seconds = since(start);
  MetricsLog log(sum.metrics_path, sum.resumed ? state_.step : -1);
  ProgressLine progress(config_.steps, 10, config_.verbose);
  progress.message("SFT warm start: held-out accuracy " + std::to_string(state_.sft_heldout_acc) +
                   (sum.resumed ? " (resumed at step " + std::to_string(state_.step) + ")" : ""));
  const auto grpo_start = Clock::now();
  std::int32_t steps_here = 0;
  while (state_.step < config_.steps) {
    if (config_.stop_after >= 0 && steps_here >= config_.stop_after) { sum.stopped_early = true; break; }
    StepRecord rec = step();
    ++steps_here;
    const bool last = state_.step == config_.steps;
    if (last || (config_.eval_every > 0 && state_.step % config_.eval_every == 0)) evaluate_into(rec, sum);
    log.write(rec);
    progress.update(rec, since(start));
    if (config_.checkpoint_every > 0 && state_.step % config_.checkpoint_every == 0 && !last) save_checkpoint();
  }
  progress.finish();
  end_run(sum, steps_here);
  sum.grpo_seconds = since(grpo_start);
  sum.seconds = since(start);
  return sum;
}

}  // namespace troupe::rl
