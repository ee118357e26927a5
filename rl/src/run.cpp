#include "troupe/rl/run.hpp"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "builtin_algorithms.hpp"
#include "troupe/actors/blas.hpp"
#include "troupe/named_registry.hpp"
#include "troupe/rl/batches.hpp"
#include "troupe/rl/config.hpp"
#include "troupe/rl/objectives.hpp"
#include "troupe/share_thread.hpp"

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

// --- the algorithms' registry ---------------------------------------------------------------------

NamedRegistry<AlgorithmFactory>& registry() {
  static NamedRegistry<AlgorithmFactory> r("algorithm");
  static const bool builtins [[maybe_unused]] =   // named here so that the linker keeps their files
      (r.put("grpo", detail::make_grpo), r.put("ppo", detail::make_ppo), r.put("dpo", detail::make_dpo), true);
  return r;
}

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

// How long the warm start runs (SftConfig): `steps`, then on to `max_steps` while the loss average
// is above the floor (`target_nll`), and over as soon as it is under the ceiling (`stop_nll`). The
// average is an exponential moving average of the batches' nll with a 20-step time constant.
class WarmStartLength {
 public:
  explicit WarmStartLength(const SftConfig& c) : c_(c) {}

  static void check(const SftConfig& c) {
    if (c.target_nll < 0 || c.stop_nll < 0 || c.max_steps < 0)
      throw std::invalid_argument("algo.sft_target_nll, sft_stop_nll and sft_max_steps must be >= 0 (0: off)");
    if (c.target_nll > 0 && c.stop_nll >= c.target_nll)
      throw std::invalid_argument("algo.sft_stop_nll (" + std::to_string(c.stop_nll) + ") must be below algo.sft_target_nll (" +
                                  std::to_string(c.target_nll) + "): the warm start's ceiling under its floor");
  }

  std::int32_t most() const { return c_.steps > 0 && c_.target_nll > 0 ? std::max(c_.steps, c_.max_steps) : c_.steps; }

  // After step `step` (from 1), whose batch's loss was `nll`: whether the warm start ends there.
  bool done(std::int32_t step, double nll) {
    average_ = average_ < 0 ? nll : average_ + (nll - average_) / 20.0;
    if (c_.stop_nll > 0 && average_ <= c_.stop_nll) return true;
    return step >= c_.steps && (c_.target_nll <= 0 || average_ <= c_.target_nll);
  }

  double average() const { return average_; }

 private:
  const SftConfig& c_;
  double average_ = -1;
};

}  // namespace

void register_algorithm(const std::string& name, AlgorithmFactory factory) { registry().put(name, std::move(factory)); }

std::vector<std::string> algorithm_names() { return registry().names(); }

std::unique_ptr<Algorithm> make_algorithm(const RunConfig& config) { return registry().at(config.algo.name)(config); }

void Algorithm::spawn(Run&) {}
void Algorithm::after_warm_start(Run&) {}
void Algorithm::save(Run&, const std::string&) {}
void Algorithm::load(Run&, const std::string&) {}
void Algorithm::stop(Run&) {}

StepClock::StepClock() : start_(Clock::now()), last_(start_) {}

void StepClock::lap(double StepTimes::*phase) {
  const auto now = Clock::now();
  times_.*phase += std::chrono::duration<double>(now - last_).count();
  last_ = now;
}

StepTimes StepClock::times() const {
  StepTimes t = times_;
  t.total = since(start_);
  return t;
}

std::uint64_t step_seed(std::uint64_t run_seed, std::int64_t step) { return mix(run_seed ^ mix(std::uint64_t(step))); }

RunConfig RunConfig::demo() {
  RunConfig c;
  c.task.spec = "addition:1-2";
  c.model.policy.context = 16;
  c.model.policy.layers = 2;
  c.model.policy.d_model = 64;
  c.model.policy.heads = 4;
  // Tuned for held-out points per second of GRPO on seeds 1-4 (README: the seeds' table): a
  // 600-step warm start (30-58 % held-out accuracy) is where GRPO climbed fastest, and a step is
  // cheap enough (~40 ms: the groups that scored alike are left out of the update, a prompt's
  // samples share one prefill, attention is one fused kernel) that 1,000 steps fit in ~45 s. The
  // warm start's loss band (0.25-0.55 nats a token) moves only the seeds whose 600 steps leave it
  // stalled above the floor or already near the ceiling of accuracy (starts 21-67 % on seeds 1-28).
  c.algo.sft.steps = 600;
  c.algo.sft.batch_size = 64;
  c.algo.sft.optim.lr = 3e-3;
  c.algo.sft.optim.warmup_steps = 20;
  c.algo.sft.target_nll = 0.55;    // a seed whose warm start stalls above it (seeds 9, 12) trains on to it,
  c.algo.sft.max_steps = 1500;
  c.algo.sft.stop_nll = 0.25;      // and one that fits fast (seeds 18, 19) stops at this
  c.algo.steps = 1000;             // 32-54 s of GRPO on a quiet 2-core VM (seeds 1-28)
  c.algo.prompts_per_step = 64;
  c.algo.group_size = 8;
  c.algo.optim.lr = 3e-4;
  c.algo.kl_coef = 0.0;            // no KL term, so no reference pass, and uniform groups drop out of the update
  c.run.eval_every = 20;
  return c;
}

// --- the run's actors ------------------------------------------------------------------------------

namespace {

// The keys every algorithm reads, checked before the warm start (an algorithm checks its own in its
// constructor): a value out of range is refused here, by key, not after minutes of SFT.
void check_config(const RunConfig& c) {
  auto need = [](bool ok, const char* key, const char* what) {
    if (!ok) throw std::invalid_argument(std::string(key) + " must be " + what);
  };
  auto finite = [](double x) { return std::isfinite(x); };
  need(c.task.train_size >= 1, "task.train_size", "at least 1");
  need(c.task.heldout_size >= 1, "task.heldout_size", "at least 1");
  need(c.algo.steps >= 0, "algo.steps", ">= 0");
  need(c.algo.prompts_per_step >= 1, "algo.prompts_per_step", "at least 1");
  need(c.algo.group_size >= 1, "algo.group_size", "at least 1");
  need(c.algo.temperature > 0 && finite(c.algo.temperature), "algo.temperature", "> 0 (the trained log-likelihoods divide by it)");
  need(c.algo.top_p > 0 && c.algo.top_p <= 1, "algo.top_p", "in (0, 1]");
  need(c.algo.clip_eps > 0 && c.algo.clip_eps < 1, "algo.clip_eps", "in (0, 1)");
  need(c.algo.kl_coef >= 0 && finite(c.algo.kl_coef), "algo.kl_coef", ">= 0");
  need(c.algo.updates_per_batch >= 1, "algo.updates_per_batch", "at least 1");
  need(c.algo.micro_batches >= 1, "algo.micro_batches", "at least 1");
  need(c.algo.gae_gamma >= 0 && c.algo.gae_gamma <= 1, "algo.gae_gamma", "in [0, 1]");
  need(c.algo.gae_lambda >= 0 && c.algo.gae_lambda <= 1, "algo.gae_lambda", "in [0, 1]");
  need(c.algo.value_clip >= 0 && finite(c.algo.value_clip), "algo.value_clip", ">= 0");
  need(c.algo.kl_horizon > 0 && finite(c.algo.kl_horizon), "algo.kl_horizon", "> 0");
  need(finite(c.algo.kl_target), "algo.kl_target", "finite (<= 0: a fixed kl_coef)");
  need(c.run.eval_every >= 0, "run.eval_every", ">= 0 (0: only at the start and the end)");
  need(c.run.checkpoint_every >= 0, "run.checkpoint_every", ">= 0 (0: only at the end)");
}

// What a run's data cursor walks: a checkpoint's cursor means nothing over other data.
std::string data_key(const RunConfig& c) {
  return c.task.spec + " train " + std::to_string(c.task.train_size) + " heldout " + std::to_string(c.task.heldout_size) +
         " share " + std::to_string(c.task.heldout_kind_share) + " seed " + std::to_string(c.run.seed);
}

}  // namespace

Run::Run(Runtime& rt, RunConfig config) : rt_(rt), config_(std::move(config)) {
  register_grpo_objective();
  check_config(config_);
  WarmStartLength::check(config_.algo.sft);
  algorithm_ = make_algorithm(config_);   // an unknown name or a refused configuration fails here, not at step 1
  advantage_ = find_advantage_estimator(config_.algo.advantage);
  rollouts_ = RolloutRange::parse(config_.placement.rollouts);
  if (!config_.model.init_weights.empty()) {
    if (!std::filesystem::is_regular_file(config_.model.init_weights))
      throw std::invalid_argument("init weights file '" + config_.model.init_weights + "' does not exist");
    config_.model.init_weights = std::filesystem::absolute(config_.model.init_weights).string();   // workers may run elsewhere
  }
  task_ = make_task(config_.task.spec);
  tokenizer_ = std::make_unique<actors::CharTokenizer>(task_->alphabet());
  config_.model.policy.vocab_size = tokenizer_->vocab_size();
  config_.model.policy.seed = config_.run.seed;
  data_ = Dataset::make(*task_, config_.task.train_size, config_.task.heldout_size, config_.run.seed,
                        config_.task.heldout_kind_share);
  state_.seed = config_.run.seed;
  state_.cursor.seed = mix(config_.run.seed ^ 0xc0ffee);
  state_.data = data_key(config_);
  config_.run.run_dir = std::filesystem::absolute(config_.run.run_dir).string();
  std::filesystem::create_directories(config_.run.run_dir);
  {   // the resolved configuration, next to the metrics
    RunConfig resolved = config_;
    std::ofstream(config_.run.run_dir + "/config.toml") << run_config_schema(resolved).to_toml();
  }
  if (config_.placement.blas_threads > 0) blas_before_ = actors::blas_threads();   // the actors set theirs (their configs)
  try {
    spawn_actors();
    algorithm_->spawn(*this);
  } catch (...) {   // no destructor runs for a constructor that throws: kill what was spawned
    try {
      release();
    } catch (const std::exception& e) {
      if (config_.run.verbose) std::cerr << "run: while stopping a run that failed to start: " << e.what() << "\n";
    }
    throw;
  }
}

Options Run::role_options(const std::string& name) const {
  Options o = Options{}.name(name);
  if (config_.placement.worker_processes) o.process(true);
  return o;
}

void Run::spawn_actors() {
  reward_backend_ = make_reward_backend(*this, config_.algo.reward);   // first: a refused spec spawns nothing
  const PlacementConfig& place = config_.placement;
  const actors::PolicyConfig& policy = config_.model.policy;
  Options trainer = Options{}.name("trainer"), rollout = Options{}.name("rollout"), weights = Options{}.name("weights"),
          reference = Options{}.name("reference");
  if (place.worker_processes) {   // the layout PlacementConfig::worker_processes describes
    const int cpus = std::max({place.trainer_threads, place.rollout_threads, place.reference_threads});
    group_ = rt_.placement_group({"CPU=" + std::to_string(cpus)}, "PACK", "grpo");
    if (!group_->ready(std::chrono::seconds(60))) throw std::runtime_error("no node has room for the trainer's bundle");
    trainer.bundle(*group_, 0, /*colocate=*/true);
    rollout.bundle(*group_, 0, /*colocate=*/true);
    weights.bundle(*group_, 0, /*colocate=*/true);   // with the trainer: publishing is one copy, pulling none
    reference.bundle(*group_, 0, /*colocate=*/true);
  }
  const Options verifier = place.verifier_process ? role_options("reward") : Options{}.name("reward");
  trainer_ = rt_.spawn<actors::Trainer>(trainer, actors::TrainerConfig{policy, config_.algo.sft.optim, place.trainer_threads, place.blas_threads});
  const actors::RolloutConfig engine{policy, place.rollout_threads, true, place.blas_threads};
  rollout_ = rt_.spawn<actors::RolloutEngine>(rollout, engine);
  reference_ = rt_.spawn<actors::Reference>(reference,
                                            actors::ReferenceConfig{policy, "", place.reference_threads, place.blas_threads});
  reward_ = rt_.spawn<actors::Reward>(verifier, actors::RewardConfig{task_->verifier(), 0.0f});
  weights_ = rt_.spawn<WeightStore>(weights);
  // The bundle's roles are called one at a time (each call of a step waits for the one before):
  // whichever of their threads is awake runs the next (PlacementConfig::share_threads). Not the
  // weight store: the elastic engines call it from their processes whenever they pull, beside
  // the step, and the roles call it from their methods (a method that waited for it while its
  // thread ran a member's call would wait for itself).
  if (place.worker_processes && place.share_threads) share_thread(trainer_, rollout_, reference_);
  // Engines 1.. run in worker processes of their own wherever the head finds room.
  const Options member = Options{}.process(true).cpus(place.rollout_threads);
  pool_ = std::make_unique<RolloutPool>(rt_, rollout_, weights_, rollouts_, member, engine);
}

Run::~Run() { release(); }

void Run::release() {
  algorithm_->stop(*this);
  if (reward_backend_) reward_backend_->stop(*this);
  pool_.reset();
  rt_.kill(trainer_);
  rt_.kill(rollout_);
  rt_.kill(reference_);
  rt_.kill(reward_);
  rt_.kill(weights_);
  if (group_) group_->remove();
  group_.reset();
  if (blas_before_ > 0) actors::set_blas_threads(blas_before_);
}

std::string Run::sft_weights_path() const { return config_.run.run_dir + "/sft.safetensors"; }

// --- warm start and evaluation ---------------------------------------------------------------------

void Run::warm_start() {
  if (!config_.model.init_weights.empty()) trainer_.call_sync(&actors::Trainer::load_trunk, config_.model.init_weights);
  DataCursor cursor{mix(config_.run.seed ^ 0x5f7), 0, 0};
  WarmStartLength length(config_.algo.sft);
  const std::int32_t most = length.most();
  ProgressLine progress(most, 50, config_.run.verbose);
  for (std::int32_t s = 1; s <= most; ++s) {
    auto batch = sft_batch(cursor.next(data_.train, std::size_t(config_.algo.sft.batch_size)), *tokenizer_);
    const double nll = trainer_.call_sync(&actors::Trainer::train_step, std::move(batch)).values["nll"];
    const bool done = length.done(s, nll);
    state_.sft_steps = s;
    if (s % 50 == 0 || s == most || done)
      progress.message("sft step " + std::to_string(s) + "/" + std::to_string(most) + "  nll " + std::to_string(nll) +
                       "  average " + std::to_string(length.average()));
    if (done) break;
  }
  trainer_.call_sync(&actors::Trainer::save_weights, sft_weights_path());
  trainer_.call_sync(&actors::Trainer::set_optimizer, config_.algo.optim);
  algorithm_->after_warm_start(*this);
  sync_weights();
  start_reference();
}

void Run::start_reference() { reference_.call_sync(&actors::Reference::load_weights, sft_weights_path()); }

EvalResult Run::evaluate() {
  actors::GenerateRequest req;
  req.prompts = encode_prompts(data_.heldout, *tokenizer_);
  req.samples_per_prompt = 1;
  req.sampling = actors::SamplingParams{0.0f, 1.0f, std::int32_t(task_->max_answer_chars() + 1), tokenizer_->eos_id(), 0};
  pool_->settle();
  auto rollout = rollout_.call_sync(&actors::RolloutEngine::generate, std::move(req));
  auto results = reward_.call_sync(&actors::Reward::score, score_items(data_.heldout, 1, rollout, *tokenizer_));
  EvalResult e;
  e.problems = std::int64_t(results.size());
  std::map<std::string, std::int64_t> of_kind;
  for (std::size_t i = 0; i < results.size(); ++i) {
    e.accuracy += results[i].correct;
    e.format_ok += results[i].format_ok;
    if (auto kind = task_->kind(data_.heldout[i]); !kind.empty()) {   // results come in the held-out set's order
      e.accuracy_by_kind[kind] += results[i].correct;
      ++of_kind[kind];
    }
  }
  if (e.problems > 0) { e.accuracy /= double(e.problems); e.format_ok /= double(e.problems); }
  for (auto& [kind, acc] : e.accuracy_by_kind) acc /= double(of_kind[kind]);
  return e;
}

// --- the roles' calls a step is written with ---------------------------------------------------------

std::vector<Problem> Run::next_prompts() { return state_.cursor.next(data_.train, std::size_t(config_.algo.prompts_per_step)); }

actors::SamplingParams Run::step_sampling(std::int64_t step) const {
  return actors::SamplingParams{config_.algo.temperature, config_.algo.top_p, std::int32_t(task_->max_answer_chars() + 1),
                                tokenizer_->eos_id(), step_seed(config_.run.seed, step)};
}

actors::RolloutBatch Run::generate(const std::vector<Problem>& problems) { return generate(problems, state_.step); }

actors::RolloutBatch Run::generate(const std::vector<Problem>& problems, std::int64_t step) {
  actors::GenerateRequest req;
  req.prompts = encode_prompts(problems, *tokenizer_);
  req.samples_per_prompt = config_.algo.group_size;
  req.sampling = step_sampling(step);
  auto samples = pool_->generate(req, &engines_);
  rollout_seconds_ += samples.seconds;
  return samples;
}

std::vector<actors::RewardResult> Run::score(const std::vector<Problem>& problems, const actors::RolloutBatch& samples) {
  auto results = reward_.call_sync(&actors::Reward::score, score_items(problems, config_.algo.group_size, samples, *tokenizer_));
  // The backend's rewards train the policy; the verifier's verdicts stay for format and accuracy.
  const auto rewards = reward_backend_->rewards(RewardInput{problems, samples, config_.algo.group_size, results});
  if (rewards.size() != results.size())
    throw std::runtime_error("reward '" + config_.algo.reward + "' gave " + std::to_string(rewards.size()) + " rewards for " +
                             std::to_string(results.size()) + " samples");
  for (std::size_t i = 0; i < results.size(); ++i) results[i].reward = rewards[i];
  return results;
}

TensorView Run::reference_logprobs(const actors::RolloutBatch& samples) { return reference_logprobs(samples.tokens, samples.attn_mask); }

TensorView Run::reference_logprobs(const TensorView& tokens, const TensorView& attn_mask) {
  return reference_logprobs(tokens, attn_mask, config_.algo.temperature);
}

TensorView Run::reference_logprobs(const TensorView& tokens, const TensorView& attn_mask, float temperature) {
  const actors::LogprobRequest request{tokens, attn_mask, temperature};
  return reference_.call_sync(&actors::Reference::logprobs, request);
}

std::vector<float> Run::advantages(const std::vector<actors::RewardResult>& rewards) {
  AdvantageInput in;
  in.rewards.reserve(rewards.size());
  for (auto& x : rewards) in.rewards.push_back(x.reward);
  in.group_size = config_.algo.group_size;
  AdvantageOutput out = advantage_(in);
  if (out.per_token || out.advantages.size() != in.rewards.size()) {
    throw std::invalid_argument("advantage estimator '" + config_.algo.advantage + "' does not give one advantage per sample");
  }
  return std::move(out.advantages);
}

actors::TrainMetrics Run::train(const actors::TrainBatch& batch) {
  auto m = trainer_.call_sync(&actors::Trainer::train_step, batch);
  count_train(m);
  return m;
}

// Through the versioned weight store: the trainer publishes, the rollout engines pull (engine 0,
// colocated: no copy beyond the publish; the others: the mapped file or the chain).
void Run::sync_weights() {
  state_.policy_version = trainer_.call_sync(&actors::Trainer::publish_to, weights_);
  pool_->pull_weights(state_.policy_version);
}

StepRecord Run::record(const actors::RolloutBatch& samples, const std::vector<actors::RewardResult>& rewards,
                       const actors::TrainMetrics& m, const StepClock& clock) const {
  StepRecord rec;
  rec.policy_version = m.policy_version;
  rec.sample_version = samples.policy_version.empty() ? 0 : samples.policy_version.front();
  double sum = 0, sq = 0, fmt = 0;
  for (auto& r : rewards) { sum += r.reward; sq += double(r.reward) * r.reward; fmt += r.format_ok; }
  const double n = double(std::max<std::size_t>(1, rewards.size()));
  rec.reward_mean = sum / n;
  rec.reward_std = std::sqrt(std::max(0.0, sq / n - rec.reward_mean * rec.reward_mean));
  rec.format_ok = fmt / n;
  rec.response_tokens = double(samples.generated_tokens) / n;
  auto value = [&](const char* k) { return m.values.count(k) ? m.values.at(k) : 0.0; };
  rec.loss = m.loss;
  rec.pg_loss = value("pg_loss");
  rec.kl = value("kl");
  rec.clip_fraction = value("clip_fraction");
  rec.values = m.values;
  rec.entropy = m.entropy;
  rec.grad_norm = m.grad_norm;
  rec.lr = m.lr;
  rec.rollout_engines = engines_;
  rec.samples_digest = samples_digest(samples);
  rec.seconds = clock.times();
  rec.actor_seconds = ActorTimes{rollout_seconds_, train_seconds_};
  rec.tokens_per_s = double(samples.generated_tokens) / std::max(1e-9, rec.seconds.total);
  return rec;
}

StepRecord Run::step() {
  rollout_seconds_ = train_seconds_ = 0;
  StepRecord rec = algorithm_->step(*this);
  ++state_.step;
  rec.step = state_.step;
  return rec;
}

// --- the summary line --------------------------------------------------------------------------------

std::string summary_json_line(const RunSummary& s) {
  auto tenth = [](double x) { return std::round(x * 10) / 10; };
  nlohmann::ordered_json out;
  out["sft_heldout_acc"] = s.sft_heldout_acc;
  out["final_heldout_acc"] = s.final_heldout_acc;
  out["sft_heldout_format"] = s.sft_heldout_format;
  out["final_heldout_format"] = s.final_heldout_format;
  out["sft_heldout_acc_by_kind"] = s.sft_heldout_acc_by_kind;
  out["final_heldout_acc_by_kind"] = s.final_heldout_acc_by_kind;
  out["steps"] = s.steps;
  out["sft_steps"] = s.sft_steps;
  out["seconds"] = tenth(s.seconds);
  out["sft_seconds"] = tenth(s.sft_seconds);
  out["grpo_seconds"] = tenth(s.grpo_seconds);
  out["metrics"] = s.metrics_path;
  out["plot"] = s.plot_path;
  out["checkpoint"] = s.checkpoint;
  out["resumed"] = s.resumed;
  return out.dump();
}

RunConfig for_job_attempt(RunConfig config) {
  const char* attempt = std::getenv("TROUPE_JOB_ATTEMPT");
  if (attempt != nullptr && std::atoi(attempt) > 1 && !config.run.resume) {
    config.run.resume = true;
    std::cerr << "attempt " << attempt << " of job " << (std::getenv("TROUPE_JOB_ID") ? std::getenv("TROUPE_JOB_ID") : "?")
              << ": resuming from the newest checkpoint in " << config.run.run_dir << " (if any)" << std::endl;
  }
  return config;
}

int run_and_report(const std::string& program, Runtime& rt, const RunConfig& config) {
  RunSummary s;
  try {
    Run driver(rt, for_job_attempt(config));
    s = driver.run();
  } catch (const std::exception& e) {
    std::cerr << program << ": " << e.what() << "\n";
    return 1;
  }
  std::cout << summary_json_line(s) << std::endl;
  return 0;
}

// --- checkpoints --------------------------------------------------------------------------------------

std::string Run::save_checkpoint() {
  const std::string dir = checkpoint_dir(config_.run.run_dir, state_.step), staging = dir + ".tmp";
  std::filesystem::remove_all(staging);
  std::filesystem::create_directories(staging);
  trainer_.call_sync(&actors::Trainer::save_checkpoint, staging);
  algorithm_->save(*this, staging);
  save_run_state(staging, state_);
  publish_checkpoint(staging, dir);
  return dir;
}

bool Run::resume() {
  auto dir = latest_checkpoint(config_.run.run_dir);
  if (!dir) return false;
  RunState loaded = load_run_state(*dir);
  // Its cursor walks its own data (an older checkpoint names none: its seed must match at least).
  if ((!loaded.data.empty() && loaded.data != state_.data) || loaded.seed != state_.seed)
    throw std::invalid_argument(*dir + " was made over other data or with another seed (" +
                                (loaded.data.empty() ? "seed " + std::to_string(loaded.seed) : loaded.data) + ", this run: " +
                                state_.data + "): resume with the same task.* keys and run.seed, or use a fresh run_dir");
  const std::string data = state_.data;
  state_ = std::move(loaded);
  state_.data = data;
  trainer_.call_sync(&actors::Trainer::set_optimizer, config_.algo.optim);
  trainer_.call_sync(&actors::Trainer::load_checkpoint, *dir);
  algorithm_->load(*this, *dir);
  sync_weights();
  start_reference();
  return true;
}

actors::Weights Run::policy_weights() { return trainer_.call_sync(&actors::Trainer::weights); }

// --- the whole run ---------------------------------------------------------------------------------------

RunSummary Run::begin_run() {
  RunSummary sum;
  sum.run_dir = config_.run.run_dir;
  sum.metrics_path = sum.run_dir + "/metrics.jsonl";
  sum.resumed = config_.run.resume && resume();
  if (!sum.resumed) {
    warm_start();
    EvalResult e = evaluate();
    state_.sft_heldout_acc = e.accuracy;
    state_.sft_heldout_format = e.format_ok;
    state_.sft_heldout_acc_by_kind = e.accuracy_by_kind;
  }
  sum.sft_heldout_acc = state_.sft_heldout_acc;
  sum.sft_heldout_format = state_.sft_heldout_format;
  sum.sft_heldout_acc_by_kind = state_.sft_heldout_acc_by_kind;
  sum.sft_steps = state_.sft_steps;
  return sum;
}

void Run::evaluate_into(StepRecord& rec, RunSummary& sum) {
  const auto t = Clock::now();
  EvalResult e = evaluate();
  rec.heldout_acc = sum.final_heldout_acc = e.accuracy;
  rec.heldout_format = sum.final_heldout_format = e.format_ok;
  rec.heldout_acc_by_kind = sum.final_heldout_acc_by_kind = e.accuracy_by_kind;
  rec.seconds.eval = since(t);
}

void Run::end_run(RunSummary& sum, std::int32_t steps_here) {
  if (!sum.stopped_early && steps_here == 0) {   // resumed at the last step: evaluate what was restored
    StepRecord unused;
    evaluate_into(unused, sum);
  }
  sum.checkpoint = std::filesystem::absolute(save_checkpoint()).string();
  sum.steps = state_.step;
  if (sum.stopped_early) return;
  std::string error;
  const std::string png = sum.run_dir + "/reward.png";
  std::string name = config_.algo.name;
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char ch) { return char(std::toupper(ch)); });
  if (plot_metrics(sum.metrics_path, png, name + " on " + config_.task.spec, sum.sft_heldout_acc, &error)) sum.plot_path = png;
  else ProgressLine(0, 1, config_.run.verbose).message("no plot: " + error);
}

RunSummary Run::run() {
  const auto start = Clock::now();
  RunSummary sum = begin_run();
  sum.sft_seconds = since(start);
  MetricsLog log(sum.metrics_path, sum.resumed ? state_.step : -1);
  ProgressLine progress(config_.algo.steps, 10, config_.run.verbose);
  progress.message("SFT warm start: held-out accuracy " + std::to_string(state_.sft_heldout_acc) +
                   (sum.resumed ? " (resumed at step " + std::to_string(state_.step) + ")" : ""));
  const auto rl_start = Clock::now();
  std::int32_t steps_here = 0;
  while (state_.step < config_.algo.steps) {
    if (config_.run.stop_after >= 0 && steps_here >= config_.run.stop_after) { sum.stopped_early = true; break; }
    StepRecord rec = step();
    ++steps_here;
    const bool last = state_.step == config_.algo.steps;
    if (last || (config_.run.eval_every > 0 && state_.step % config_.run.eval_every == 0)) evaluate_into(rec, sum);
    log.write(rec);
    progress.update(rec, since(start));
    if (config_.run.checkpoint_every > 0 && state_.step % config_.run.checkpoint_every == 0 && !last) save_checkpoint();
  }
  progress.finish();
  end_run(sum, steps_here);
  sum.grpo_seconds = since(rl_start);
  sum.seconds = since(start);
  return sum;
}

}  // namespace troupe::rl
