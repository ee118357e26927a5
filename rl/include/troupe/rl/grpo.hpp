// GRPO (Shao et al. 2024, arXiv:2402.03300, Algorithm 1) as an actor graph:
//
//   trainer    Trainer        policy pi_theta, AdamW            (colocated with the rollout engine)
//   rollout    RolloutEngine  samples G responses per prompt     (swaps to each new version;
//                             more engines in an elastic group with --rollouts MIN:MAX)
//   reference  Reference      frozen pi_ref = the SFT warm start
//   reward     Reward         rule verifier of the task
//
// One step:  generate -> score -> reference logprobs -> group advantages -> update (x mu) ->
// sync weights -> log. Each is a short function below; the math is in advantages.hpp and
// objectives.hpp. A run is SFT warm start, held-out evaluation, `steps` GRPO steps with an
// evaluation every eval_every steps, a final evaluation and a plot.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "troupe/actors/reference.hpp"
#include "troupe/actors/reward.hpp"
#include "troupe/actors/reward_model.hpp"
#include "troupe/actors/rollout_engine.hpp"
#include "troupe/actors/tokenizer.hpp"
#include "troupe/actors/trainer.hpp"
#include "troupe/rl/advantages.hpp"
#include "troupe/rl/checkpoint.hpp"
#include "troupe/rl/metrics.hpp"
#include "troupe/rl/rollouts.hpp"
#include "troupe/rl/task.hpp"

namespace troupe::rl {

struct SftConfig {
  std::int32_t steps = 300;         // 0 skips the warm start
  std::int32_t batch_size = 64;
  actors::OptimConfig optim;
};

struct GrpoConfig {
  std::string task = "addition:1-3";     // make_task spec
  std::size_t train_size = 20000;
  std::size_t heldout_size = 500;
  actors::PolicyConfig policy;           // vocab_size is set from the task's tokenizer
  SftConfig sft;
  std::int32_t steps = 100;
  std::int32_t prompts_per_step = 32;
  std::int32_t group_size = 8;           // G
  float temperature = 1.0f;
  float top_p = 1.0f;
  actors::OptimConfig optim;             // GRPO's optimizer (fresh after the warm start)
  // The advantage estimator, by name (advantages.hpp): "grpo", "rloo", "reinforce++",
  // "reinforce++_baseline", or one the program registers with TROUPE_ADVANTAGE_ESTIMATOR. It
  // must give one advantage per sample (a per-token one, GAE, needs a critic: PPO).
  // What each step's update is: "grpo" (advantages, the objective below) or "dpo" (the step's own
  // samples as preference pairs, preference_pairs/dpo_batch, against the reference: online DPO).
  // "ppo": a critic (the policy's architecture with a value head, its own AdamW, from the SFT
  // trunk) and per-token GAE advantages over rewards that carry the KL penalty (ppo_update).
  std::string algorithm = "grpo";
  double gae_gamma = 1.0, gae_lambda = 0.95;   // PPO's GAE
  double value_clip = 0.2;                     // PPO's clipped value loss
  actors::OptimConfig critic_optim;            // PPO's critic
  std::string critic_init;                     // PPO: "" starts the critic from the SFT trunk; a reward
                                               // model's file (build/bin/reward_model) from its trunk and score head
  std::int32_t mini_batches = 1;               // PPO: optimizer steps per epoch, each over 1/mini_batches of the rows
  double dpo_beta = 0.1;
  bool dpo_ipo = false;                  // IPO's squared loss instead of DPO's logistic one
  std::string advantage = "grpo";
  // Where each sample's reward comes from: "rule" (the task's verifier) or "model:PATH" (a
  // RewardModel actor loading build/bin/reward_model's safetensors, for this run's architecture
  // with a score head, scores every sample, batched). Held-out accuracy and the format and
  // correctness figures always come from the verifier.
  std::string reward = "rule";
  // The Trainer's objective, by name (actors/objective.hpp): "grpo", or one the program registers
  // at static initialisation (so that a Trainer in a worker process has it too). It reads the
  // inputs old_logp, ref_logp, advantages and the options clip_eps, kl_coef.
  std::string objective = "grpo";
  double clip_eps = 0.2;
  double kl_coef = 0.04;                 // beta
  std::int32_t updates_per_batch = 1;    // mu: optimizer steps on each batch of samples
  std::int32_t micro_batches = 1;        // gradient accumulation inside each update
  std::int32_t eval_every = 10;          // 0: only at the start and the end
  std::int32_t checkpoint_every = 0;     // 0: only at the end
  std::uint64_t seed = 1;
  // libtorch intra-op threads per actor. The phases of a step run one after another, so each actor
  // could use every core; but for the demo's model the ops are tiny and OpenMP's barriers cost more
  // than they save (measured on 2 cores: 37 ms per SFT step with 1 thread, 470 ms with 2 under
  // load), so 1 is the default. Raise it for models whose matmuls are large.
  std::int32_t trainer_threads = 1;
  std::int32_t rollout_threads = 1;
  std::int32_t reference_threads = 1;
  // false: every actor on its own thread of this process (the default; what the demo measures).
  // true: trainer and rollout engine share one worker process (one bundle of a PACK placement
  // group, colocated, so the weight hand-over stays a pointer swap); reference and reward get a
  // worker process each. With --address, workers run on the cluster's nodes (run_dir must then
  // be a path every node sees).
  bool worker_processes = false;
  // Rollout engines, MIN:MAX (RolloutRange): engine 0 beside the trainer, the others an elastic
  // group (each in a worker process of its own, placed by the head; they join and leave while the
  // run goes on). The number of engines changes the speed, never the samples (rollouts.hpp).
  std::string rollouts = "1:1";
  std::string run_dir = "runs/grpo";     // made absolute: workers may run elsewhere
  bool resume = false;                   // continue from the newest checkpoint in run_dir
  std::int32_t stop_after = -1;          // >= 0: checkpoint and stop after this many steps (tests)
  bool verbose = true;                   // progress on stderr

  // The configuration of `make demo`: addition of 1-2 digit numbers, a few minutes on 2 cores.
  static GrpoConfig demo();
};

// The sampling seed of step `step` (0-based) of a run: a pure function of the two, so a resumed run
// needs no RNG state to draw the same samples.
std::uint64_t step_seed(std::uint64_t run_seed, std::int64_t step);

// The Trainer's batch for one GRPO update: tokens and masks of the rollout, the loss on the response,
// inputs ref_logp and advantages (one per row), and old_logp (the sampler's) when there are several
// updates per batch (mu > 1); with one, the update is on-policy and its math does not depend on
// which engines sampled (grpo_objective).
actors::TrainBatch grpo_batch(const actors::RolloutBatch& rollout, const TensorView& ref_logp,
                              const std::vector<float>& advantages, const GrpoConfig& config);

struct EvalResult {
  double accuracy = 0;     // exact answers with a valid format
  double format_ok = 0;
  std::int64_t problems = 0;
};

struct RunSummary {
  double sft_heldout_acc = 0, sft_heldout_format = 0;
  double final_heldout_acc = 0, final_heldout_format = 0;
  std::int64_t steps = 0;
  double seconds = 0, sft_seconds = 0, grpo_seconds = 0;
  std::string run_dir, metrics_path, plot_path, checkpoint;
  bool stopped_early = false;            // stop_after was reached
  bool resumed = false;                  // started from a checkpoint
};

// The summary as the programs print it, one JSON object on one line: sft_heldout_acc,
// final_heldout_acc, sft_heldout_format, final_heldout_format, steps, seconds, sft_seconds,
// grpo_seconds (the RL phase, whatever the algorithm), metrics, plot, checkpoint, resumed.
std::string summary_json_line(const RunSummary& summary);

// The end of a program's main: runs the driver on `config` and prints summary_json_line on stdout;
// 0, or 1 with "<program>: <why>" on stderr when the run fails.
// A job's later attempt (TROUPE_JOB_ATTEMPT > 1) resumes from the newest checkpoint in run_dir (a
// fresh start when there is none): run_and_report applies this.
GrpoConfig for_job_attempt(GrpoConfig config);
int run_and_report(const std::string& program, Runtime& rt, const GrpoConfig& config);

class Grpo {
 public:
  // Spawns the four actors on `rt` and prepares the run directory. The runtime must outlive this.
  Grpo(Runtime& rt, GrpoConfig config);
  ~Grpo();

  RunSummary run();

  // The pieces of run(), public for tests and benchmarks.
  void warm_start();                     // SFT, then saves <run_dir>/sft.safetensors (pi_ref)
  bool resume();                         // false when run_dir has no checkpoint
  StepRecord step();
  EvalResult evaluate();                 // greedy decoding of the held-out set
  std::string save_checkpoint();         // returns its directory
  const RunState& state() const { return state_; }
  const GrpoConfig& config() const { return config_; }
  actors::Weights policy_weights();      // the trainer's current weights

 private:
  std::vector<Problem> next_prompts();
  actors::RolloutBatch generate(const std::vector<Problem>& problems);
  std::vector<actors::RewardResult> score(const std::vector<Problem>& problems, const actors::RolloutBatch& rollout);
  TensorView reference_logprobs(const actors::RolloutBatch& rollout);
  std::vector<float> advantages(const std::vector<actors::RewardResult>& rewards);
  actors::TrainMetrics update(const actors::RolloutBatch& rollout, const TensorView& ref_logp,
                              const std::vector<float>& advantages);
  actors::TrainMetrics ppo_update(const actors::RolloutBatch& rollout, const TensorView& ref_logp,
                                  const std::vector<actors::RewardResult>& rewards);
  actors::TrainMetrics dpo_update(const actors::RolloutBatch& rollout, const TensorView& ref_logp,
                                  const std::vector<actors::RewardResult>& rewards);
  void sync_weights();
  void start_reference();
  void spawn_actors();
  RunSummary begin_run();                // resume, or warm start and evaluate the SFT policy
  void evaluate_into(StepRecord& rec, RunSummary& sum);
  void end_run(RunSummary& sum, std::int32_t steps_here);   // final checkpoint and plot

  Runtime& rt_;
  GrpoConfig config_;
  AdvantageEstimator advantage_;   // config_.advantage's
  std::unique_ptr<Task> task_;
  std::unique_ptr<actors::Tokenizer> tokenizer_;
  Dataset data_;
  RunState state_;
  ActorRef<actors::Trainer> trainer_;
  ActorRef<actors::RolloutEngine> rollout_;   // engine 0, beside the trainer
  ActorRef<WeightStore> weights_;   // the trainer publishes each version here; the rollout pulls it
  RolloutRange rollouts_;
  std::unique_ptr<RolloutPool> pool_;         // engine 0 and the elastic group of the others
  int engines_ = 1;                           // the last step's
  ActorRef<actors::Reference> reference_;
  ActorRef<actors::Reward> reward_;
  std::optional<ActorRef<actors::Trainer>> critic_;   // algorithm = "ppo"
  std::optional<ActorRef<actors::RewardModel>> reward_model_;   // reward = "model:PATH"
  std::optional<PlacementGroup> group_;   // worker_processes only; removed with the Grpo
};

}  // namespace troupe::rl
