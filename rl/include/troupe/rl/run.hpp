// The run skeleton every algorithm composes: the role actors, the data, the SFT warm start, the
// held-out evaluation, weight sync, metrics JSONL and the progress line, checkpoints with the data
// cursor, the plot and the summary line. An algorithm (GRPO, PPO, DPO, or a user's) is one class
// whose step() reads like its paper's pseudo-code over the run's roles:
//
//   trainer    Trainer        policy pi_theta, AdamW            (colocated with rollout engine 0)
//   rollout    RolloutEngine  samples G responses per prompt     (more engines: --rollouts MIN:MAX)
//   reference  Reference      frozen pi_ref = the SFT warm start  (not asked by GRPO with beta 0)
//   reward     Reward         rule verifier of the task, or a RewardModel (reward = model:PATH)
//   + the algorithm's own      (PPO's critic)
//
//   StepRecord step(Run& run) override {
//     StepClock clock;
//     const auto prompts = run.next_prompts();
//     const auto samples = run.generate(prompts);           clock.lap(&StepTimes::rollout);
//     const auto rewards = run.score(prompts, samples);     clock.lap(&StepTimes::reward);
//     ...                                                   // the algorithm's update
//     run.sync_weights();                                   clock.lap(&StepTimes::sync);
//     return run.record(samples, rewards, metrics, clock);
//   }
//
// Algorithms are registered by name (TROUPE_ALGORITHM, at static initialisation); RunConfig's
// algo.name picks one. A run is: SFT warm start, held-out evaluation, `steps` steps with an
// evaluation every eval_every steps, a final evaluation, a checkpoint and a plot.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "troupe/actors/reference.hpp"
#include "troupe/actors/reward.hpp"
#include "troupe/actors/rollout_engine.hpp"
#include "troupe/actors/tokenizer.hpp"
#include "troupe/actors/trainer.hpp"
#include "troupe/rl/advantages.hpp"
#include "troupe/rl/checkpoint.hpp"
#include "troupe/rl/metrics.hpp"
#include "troupe/rl/reward.hpp"
#include "troupe/rl/rollouts.hpp"
#include "troupe/rl/task.hpp"

namespace troupe::rl {

struct SftConfig {
  std::int32_t steps = 300;         // 0 skips the warm start; with target_nll, the least it takes (but see stop_nll)
  std::int32_t batch_size = 64;
  actors::OptimConfig optim;
  // > 0: after `steps`, the warm start goes on (to max_steps at most) while the moving average of
  // its batches' loss (answer tokens' negative log-likelihood, nats a token, a 20-step time
  // constant) is above this: a seed whose warm start stalls still starts RL from a set fit of the
  // train data, and one that fits sooner is not changed.
  double target_nll = 0;
  std::int32_t max_steps = 0;
  // > 0: the warm start ends as soon as that moving average falls to this, before `steps` too: a
  // seed whose warm start fits the train data fast does not start RL near its ceiling.
  double stop_nll = 0;
};

// The verifiable task and its data.
struct TaskConfig {
  std::string spec = "addition:1-3";     // make_task spec
  std::size_t train_size = 20000;
  std::size_t heldout_size = 500;
  // At most this share of a kind of problem is held out (Dataset::make); >= 1: no bound.
  double heldout_kind_share = kHeldoutKindShare;
};

// The policy's architecture and where its weights start.
struct ModelConfig {
  actors::PolicyConfig policy;           // vocab_size is set from the task's tokenizer, seed from run.seed
  // A policy's safetensors to start from (e.g. another run's sft.safetensors), the SFT warm start
  // continuing from it; "": the seed's initial weights.
  std::string init_weights;
};

// The SFT warm start and the algorithm with its hyper-parameters.
struct AlgoConfig {
  // The algorithm, by name: "grpo" (grpo.cpp), "ppo" (ppo.cpp), "dpo" (dpo.cpp), or one the program
  // registers with TROUPE_ALGORITHM.
  std::string name = "grpo";
  SftConfig sft;
  std::int32_t steps = 100;
  std::int32_t prompts_per_step = 32;
  std::int32_t group_size = 8;           // G
  float temperature = 1.0f;
  float top_p = 1.0f;
  actors::OptimConfig optim;             // the RL optimizer (fresh after the warm start)
  // GRPO's advantage estimator, by name (advantages.hpp): "grpo", "rloo", "reinforce++",
  // "reinforce++_baseline", or one the program registers with TROUPE_ADVANTAGE_ESTIMATOR. It
  // must give one advantage per sample (a per-token one, GAE, needs a critic: PPO).
  std::string advantage = "grpo";
  // Where each sample's reward comes from, a reward backend (reward.hpp): "rule" (the task's
  // verifier), "model:PATH" (a RewardModel actor loading build/bin/reward_model's safetensors, for
  // this run's architecture with a score head, scores every sample, batched), or one the program
  // registers with TROUPE_REWARD_BACKEND. Held-out accuracy and the format and correctness figures
  // always come from the verifier.
  std::string reward = "rule";
  // GRPO's Trainer objective, by name (actors/objective.hpp): "grpo", or one the program registers
  // with TROUPE_OBJECTIVE (so that a Trainer in a worker process has it too). It reads the inputs
  // old_logp, ref_logp, advantages and the options clip_eps, kl_coef.
  std::string objective = "grpo";
  double clip_eps = 0.2;
  double kl_coef = 0.04;                 // beta (PPO: its initial value when kl_target > 0)
  std::int32_t updates_per_batch = 1;    // mu: optimizer steps on each batch of samples (PPO: epochs)
  std::int32_t micro_batches = 1;        // gradient accumulation inside each update
  // GRPO, kl_coef 0, the library's grpo_objective (under any name, but not a program's own objective
  // registered as "grpo"): leave the groups whose advantages are all 0 out of the update (they carry
  // no gradient; the loss still averages over every row, so the update is the same). Only the
  // entropy metric changes: it is over the updated samples.
  bool skip_zero_advantage = true;
  // PPO: GAE, the critic (the policy's architecture with a value head, its own AdamW), the
  // adaptive KL controller (Ziegler et al. 2019; kl_target <= 0: kl_coef stays fixed).
  double gae_gamma = 1.0, gae_lambda = 0.95;
  double value_clip = 0.2;
  actors::OptimConfig critic_optim;
  std::string critic_init;               // "": from the SFT trunk; a reward model's file: its trunk and score head
  std::int32_t mini_batches = 1;         // optimizer steps per epoch, each over 1/mini_batches of the rows
  double kl_target = 0.0;                // nats per sample (the sum over its response tokens)
  double kl_horizon = 10000.0;           // samples
  // DPO: beta, IPO's squared loss instead of DPO's logistic one, and the round length: every
  // dpo_round_steps steps the current policy samples the pairs of the next that many steps (1: each
  // step's own samples, online DPO; = steps: every pair from the SFT policy, offline DPO).
  double dpo_beta = 0.1;
  bool dpo_ipo = false;
  std::int32_t dpo_round_steps = 1;
};

// The run's bookkeeping: seed, evaluation and checkpoint cadence, output, resume.
struct RunOptions {
  std::uint64_t seed = 1;
  std::int32_t eval_every = 10;          // 0: only at the start and the end
  std::int32_t checkpoint_every = 0;     // 0: only at the end
  std::string run_dir = "runs/grpo";     // made absolute: workers may run elsewhere
  bool resume = false;                   // continue from the newest checkpoint in run_dir
  std::int32_t stop_after = -1;          // >= 0: checkpoint and stop after this many steps (tests)
  bool verbose = true;                   // progress on stderr
};

// Where the actors run and with how many threads.
struct PlacementConfig {
  // libtorch intra-op threads per actor. The phases of a step run one after another, so each actor
  // could use every core; but for the demo's model the ops are tiny and OpenMP's barriers cost more
  // than they save (measured on 2 cores: 37 ms per SFT step with 1 thread, 470 ms with 2 under
  // load), so 1 is the default. Raise it for models whose matmuls are large.
  std::int32_t trainer_threads = 1;
  std::int32_t rollout_threads = 1;
  std::int32_t reference_threads = 1;
  // OpenBLAS's threads in every process that runs the run's actors (actors/blas.hpp: its pool is
  // process-wide; this process's is restored when the run ends). 0 leaves the BLAS's default,
  // every core: the fastest when one actor computes at a time (GRPO, DPO). 1 when actors compute
  // side by side (PPO's policy and critic train at once: build/bin/ppo sets it). The thread count
  // changes a GEMM's last bits: runs compare bit for bit only at the same setting.
  std::int32_t blas_threads = 0;
  // false: every actor on its own thread of this process (the default; what the demo measures).
  // true: the policy's roles, trainer, rollout engine 0 and reference, share one worker process
  // (one bundle of a PACK placement group, colocated: the weight hand-over stays a pointer swap, and
  // the phases of a step run one after another in one process, as verl's actor-rollout-ref worker
  // does); the rule verifier stays in this process (a few microseconds of string work a sample:
  // a process of its own only adds a call across processes to every step, as verl's driver keeps
  // its reward function); the algorithm's own roles (PPO's critic) and a learned reward model
  // (--reward model:PATH) get a worker process each. With --address, workers run on the cluster's
  // nodes (run.run_dir must then be a path every node sees).
  // Measured on 2026-12-05 (rl_step, 200 DPO steps a run): with the reference and the verifier in
  // workers of their own, 1.00-1.24 x the plain loop (13 runs, median 1.15); with this layout
  // 0.96-1.17 (19 runs, median 1.08): a cross-process call fewer a step, and the reference's pass
  // and the trainer's step each ran faster beside each other than a process apart.
  bool worker_processes = false;
  // With worker_processes: the rule verifier in a worker process of its own, for a verifier heavy
  // enough to want a core (a sandbox that runs code, a symbolic checker).
  bool verifier_process = false;
  // With worker_processes: the policy's roles in the trainer's worker (trainer, rollout engine 0,
  // reference) share their threads (troupe/share_thread.hpp): the thread that answered one call of
  // a step runs the next, whichever role it is for, as verl's fused worker runs them on one
  // thread, rather than hand it to that role's thread and wait for it to wake (~100 us a call on a
  // small VM). A step calls them one at a time, so nothing waits for it. false: each role's calls
  // run on its own thread only.
  bool share_threads = true;
  // Rollout engines, MIN:MAX (RolloutRange): engine 0 beside the trainer, the others an elastic
  // group (each in a worker process of its own, placed by the head; they join and leave while the
  // run goes on). The number of engines changes the speed, never the samples (rollouts.hpp).
  std::string rollouts = "1:1";
};

// One run's configuration, in the five parts its keys (config.hpp, run_config_schema) are named
// by: task.*, model.*, algo.* (SFT and the algorithm), run.* and placement.*.
struct RunConfig {
  TaskConfig task;
  ModelConfig model;
  AlgoConfig algo;
  RunOptions run;
  PlacementConfig placement;

  // The configuration of `make demo`: GRPO on addition of 1-2 digit numbers, a few minutes on 2 cores.
  static RunConfig demo();
};

// The sampling seed of step `step` (0-based) of a run: a pure function of the two, so a resumed run
// needs no RNG state to draw the same samples.
std::uint64_t step_seed(std::uint64_t run_seed, std::int64_t step);

struct EvalResult {
  double accuracy = 0;     // exact answers with a valid format
  double format_ok = 0;
  std::int64_t problems = 0;
  std::map<std::string, double> accuracy_by_kind;   // by Task::kind (addition: "1+2"); empty when the task has no kinds
};

struct RunSummary {
  double sft_heldout_acc = 0, sft_heldout_format = 0;
  double final_heldout_acc = 0, final_heldout_format = 0;
  std::map<std::string, double> sft_heldout_acc_by_kind, final_heldout_acc_by_kind;
  std::int64_t steps = 0, sft_steps = 0;   // sft_steps: the warm start's steps taken
  double seconds = 0, sft_seconds = 0, grpo_seconds = 0;   // grpo_seconds: the RL phase, whatever the algorithm
  std::string run_dir, metrics_path, plot_path, checkpoint;
  bool stopped_early = false;            // stop_after was reached
  bool resumed = false;                  // started from a checkpoint
};

// The summary as the programs print it, one JSON object on one line: sft_heldout_acc,
// final_heldout_acc, sft_heldout_format, final_heldout_format, sft_heldout_acc_by_kind and
// final_heldout_acc_by_kind (objects, kind -> accuracy; empty for a task without kinds, and the
// start's for a run resumed from a checkpoint written before the field existed), steps, sft_steps,
// seconds, sft_seconds, grpo_seconds (the RL phase, whatever the algorithm), metrics, plot,
// checkpoint, resumed.
std::string summary_json_line(const RunSummary& summary);

// A job's later attempt (TROUPE_JOB_ATTEMPT > 1) resumes from the newest checkpoint in run_dir (a
// fresh start when there is none).
RunConfig for_job_attempt(RunConfig config);
// The end of a program's main: runs `config` (for_job_attempt applied) and prints
// summary_json_line on stdout; 0, or 1 with "<program>: <why>" on stderr when the run fails.
int run_and_report(const std::string& program, Runtime& rt, const RunConfig& config);

// The wall-clock split of one step: lap(&StepTimes::rollout) books the time since the last lap.
class StepClock {
 public:
  StepClock();
  void lap(double StepTimes::*phase);
  StepTimes times() const;   // the laps, and total = the time since construction

 private:
  std::chrono::steady_clock::time_point start_, last_;
  StepTimes times_;
};

class Run;

// One algorithm over a Run. The hooks other than step() have defaults that do nothing.
class Algorithm {
 public:
  virtual ~Algorithm() = default;
  // Spawns the algorithm's own role actors once the run's exist (Run::role_options places them).
  virtual void spawn(Run& run);
  // After the SFT warm start saved pi_ref (Run::sft_weights_path), before the first step.
  virtual void after_warm_start(Run& run);
  // One step: sample, score, update, hand the new weights to the rollout engines. The run counts
  // the steps and numbers the record.
  virtual StepRecord step(Run& run) = 0;
  // Its part of a checkpoint directory (the run writes the trainer's and the RunState, whose
  // `values` carry an algorithm's scalars), and of a resume from one.
  virtual void save(Run& run, const std::string& dir);
  virtual void load(Run& run, const std::string& dir);
  // Kills its actors: the run calls it before it kills its own, also when the run fails to start
  // (then some of its roles, or all, may not have been spawned).
  virtual void stop(Run& run);
};

using AlgorithmFactory = std::function<std::unique_ptr<Algorithm>(const RunConfig&)>;
// Registration is thread-safe; a later one under the same name replaces the earlier.
void register_algorithm(const std::string& name, AlgorithmFactory factory);
// Throws std::invalid_argument for an unknown name (listing the known ones) and whatever the
// factory throws for a configuration it refuses.
std::unique_ptr<Algorithm> make_algorithm(const RunConfig& config);
std::vector<std::string> algorithm_names();

class Run {
 public:
  // Makes the algorithm, spawns the run's actors and the algorithm's on `rt` and prepares the run
  // directory (the resolved configuration as config.toml). The runtime must outlive this.
  Run(Runtime& rt, RunConfig config);
  ~Run();
  Run(const Run&) = delete;
  Run& operator=(const Run&) = delete;

  RunSummary run();

  // The pieces of run(), public for tests and benchmarks.
  void warm_start();                     // SFT, saves <run_dir>/sft.safetensors (pi_ref), the RL optimizer
  bool resume();                         // false when run_dir has no checkpoint
  StepRecord step();                     // the algorithm's step, counted
  EvalResult evaluate();                 // greedy decoding of the held-out set
  std::string save_checkpoint();         // returns its directory
  actors::Weights policy_weights();      // the trainer's current weights

  // What an algorithm's step is written with.
  const RunConfig& config() const { return config_; }
  RunState& state() { return state_; }
  const RunState& state() const { return state_; }
  Runtime& runtime() { return rt_; }
  const actors::Tokenizer& tokenizer() const { return *tokenizer_; }
  const Dataset& data() const { return data_; }
  const Task& task() const { return *task_; }
  ActorRef<actors::Trainer>& trainer() { return trainer_; }
  std::string sft_weights_path() const;
  // Placement for an algorithm's own role actor named `name`: a worker process of its own with
  // worker_processes, a thread of this process otherwise (PPO's critic's and a reward model's placement).
  Options role_options(const std::string& name) const;
  // Sampling parameters of step `step`'s draw (0-based): the config's temperature and top_p, the
  // step's seed (step_seed).
  actors::SamplingParams step_sampling(std::int64_t step) const;

  std::vector<Problem> next_prompts();   // prompts_per_step from the data cursor
  // group_size samples of each problem, split across the rollout engines by cost (the split changes
  // nothing: every sample is keyed by (run seed, step, its prompt's index, its index)).
  actors::RolloutBatch generate(const std::vector<Problem>& problems);
  // As step `step` draws them (an algorithm that samples ahead: DPO's rounds).
  actors::RolloutBatch generate(const std::vector<Problem>& problems, std::int64_t step);
  // Row r answers problems[r / group_size]. The reward backend's (config.algo.reward) rewards replace
  // the verifier's; format_ok and correct stay the verifier's.
  std::vector<actors::RewardResult> score(const std::vector<Problem>& problems, const actors::RolloutBatch& samples);
  TensorView reference_logprobs(const actors::RolloutBatch& samples);   // [N, T] f32
  // Of any rows: [R, T] f32, at `temperature` (the sampling temperature unless given: the policy's
  // logprobs in a batch are at its TrainBatch::temperature, which a KL or a DPO margin must match).
  TensorView reference_logprobs(const TensorView& tokens, const TensorView& attn_mask);
  TensorView reference_logprobs(const TensorView& tokens, const TensorView& attn_mask, float temperature);
  // The configured estimator's one advantage per sample (config.algo.advantage).
  std::vector<float> advantages(const std::vector<actors::RewardResult>& rewards);
  actors::TrainMetrics train(const actors::TrainBatch& batch);          // one optimizer step of the policy
  // A train step of the policy made through trainer() directly (PPO's, beside its critic's): its
  // time inside the trainer counts in the step's record (ActorTimes), as train()'s do.
  void count_train(const actors::TrainMetrics& m) { train_seconds_ += m.seconds; }
  // Publishes the trainer's weights to the store; every engine pulls them (engine 0 in a worker
  // process: its pull leaves with, and is answered before, its next generate: RolloutPool).
  void sync_weights();
  // The step's record: reward statistics of `rewards`, the trainer's metrics, the clock's split,
  // the samples' digest and engines, and the step's time inside the engines' generates and the
  // trainer's train steps (generate(), train(), count_train(): ActorTimes).
  StepRecord record(const actors::RolloutBatch& samples, const std::vector<actors::RewardResult>& rewards,
                    const actors::TrainMetrics& metrics, const StepClock& clock) const;

 private:
  void start_reference();
  void spawn_actors();
  void release();                        // kills every actor spawned so far, the algorithm's and the backend's first
  RunSummary begin_run();                // resume, or warm start and evaluate the SFT policy
  void evaluate_into(StepRecord& rec, RunSummary& sum);
  void end_run(RunSummary& sum, std::int32_t steps_here);   // final checkpoint and plot

  Runtime& rt_;
  RunConfig config_;
  std::unique_ptr<Algorithm> algorithm_;
  AdvantageEstimator advantage_;   // config_.advantage's
  std::unique_ptr<Task> task_;
  std::unique_ptr<actors::Tokenizer> tokenizer_;
  Dataset data_;
  RunState state_;
  ActorRef<actors::Trainer> trainer_;
  ActorRef<actors::RolloutEngine> rollout_;   // engine 0, beside the trainer
  ActorRef<WeightStore> weights_;   // the trainer publishes each version here; the engines pull it
  RolloutRange rollouts_;
  std::unique_ptr<RolloutPool> pool_;         // engine 0 and the elastic group of the others
  int engines_ = 1;                           // the last generate's
  double rollout_seconds_ = 0, train_seconds_ = 0;   // this step's in the engines' generates and the trainer's train steps (ActorTimes)
  ActorRef<actors::Reference> reference_;
  ActorRef<actors::Reward> reward_;
  std::unique_ptr<RewardBackend> reward_backend_;   // config_.reward's: what the samples are rewarded with
  std::optional<PlacementGroup> group_;   // worker_processes only; removed with the Run
  int blas_before_ = 0;                   // OpenBLAS's threads before config_.blas_threads, restored at the end
};

}  // namespace troupe::rl

#define TROUPE_DETAIL_ALGO_CAT2(a, b) a##b
#define TROUPE_DETAIL_ALGO_CAT(a, b) TROUPE_DETAIL_ALGO_CAT2(a, b)
// Registers `Type` (an Algorithm constructible from `const RunConfig&`) as `name` at static
// initialisation: at namespace scope of a file the program links (a static library's object file
// that nothing else references is left out by the linker).
#define TROUPE_ALGORITHM(name, Type)                                                                  \
  static const bool TROUPE_DETAIL_ALGO_CAT(troupe_algorithm_, __COUNTER__) [[maybe_unused]] =            \
      (::troupe::rl::register_algorithm(name, [](const ::troupe::rl::RunConfig& c) -> std::unique_ptr<::troupe::rl::Algorithm> { \
         return std::make_unique<Type>(c);                                                              \
       }),                                                                                              \
       true)
