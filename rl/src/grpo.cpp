// GRPO (Shao et al. 2024, "DeepSeekMath", arXiv:2402.03300, Algorithm 1): for each batch of
// prompts, sample G outputs per prompt from the current policy, score them, give each output its
// group-relative advantage (A_i = (r_i - mean(r)) / std(r) over its prompt's G outputs; or the
// configured estimator), take mu optimizer steps on the clipped surrogate with a k3 KL penalty to
// the reference, then hand the new weights to the sampler.
#include <algorithm>

#include "builtin_algorithms.hpp"
#include "troupe/rl/algorithms.hpp"
#include "troupe/rl/batches.hpp"

namespace troupe::rl {

actors::TrainBatch grpo_batch(const actors::RolloutBatch& samples, const TensorView& ref_logp,
                              const std::vector<float>& advantages, const RunConfig& config) {
  actors::TrainBatch b;
  b.objective = config.algo.objective;
  b.tokens = samples.tokens;
  b.attn_mask = samples.attn_mask;
  b.loss_mask = samples.response_mask;
  b.inputs = {{"advantages", vector_view(advantages)}};
  if (ref_logp.data != nullptr) b.inputs["ref_logp"] = ref_logp;   // none with kl_coef 0
  if (config.algo.updates_per_batch > 1) b.inputs["old_logp"] = samples.logprobs;   // the ratio to the sampling policy
  b.options = {{"clip_eps", config.algo.clip_eps}, {"kl_coef", config.algo.kl_coef}};
  b.temperature = config.algo.temperature;
  b.micro_batches = config.algo.micro_batches;
  b.row_group = config.algo.group_size;   // a prompt's samples stay in one micro-batch
  if (!config.algo.skip_zero_advantage || config.algo.kl_coef != 0 || !detail::is_grpo_objective(b.objective)) return b;
  // With no KL term the clipped surrogate of a sample whose advantage is 0 is 0 whatever the
  // policy: a group that scored all alike (all right, all wrong) adds nothing to the gradient. The
  // update leaves such groups out, and loss_rows keeps the mean over every row: the same step, with
  // the forward and backward passes of the groups that carry a gradient only. That holds for
  // grpo_objective, the function, not for the name "grpo": a program may register its own there.
  const auto g = std::size_t(std::max(1, config.algo.group_size));
  if (advantages.size() % g != 0) return b;   // not whole groups: the trainer refuses the batch as it is
  std::vector<std::int64_t> rows;
  for (std::size_t first = 0; first + g <= advantages.size(); first += g) {
    if (std::any_of(advantages.begin() + std::ptrdiff_t(first), advantages.begin() + std::ptrdiff_t(first + g),
                    [](float a) { return a != 0.0f; })) {
      for (std::size_t r = first; r < first + g; ++r) rows.push_back(std::int64_t(r));
    }
  }
  if (rows.size() == advantages.size()) return b;
  if (rows.empty()) {   // no gradient at all: one group stands for the batch (a zero gradient, the optimizer still steps)
    for (std::size_t r = 0; r < std::min(g, advantages.size()); ++r) rows.push_back(std::int64_t(r));
  }
  actors::TrainBatch kept = select_rows(b, rows);
  kept.loss_rows = std::int64_t(advantages.size());
  return kept;
}

namespace {

class Grpo final : public Algorithm {
 public:
  explicit Grpo(const RunConfig& c) {
    if (!detail::objective_registered(c.algo.objective))
      throw std::invalid_argument("grpo: no objective '" + c.algo.objective + "' (algo.objective: grpo, or one the program registers with TROUPE_OBJECTIVE)");
  }

  StepRecord step(Run& run) override {
    StepClock clock;
    const auto prompts = run.next_prompts();
    const auto samples = run.generate(prompts);                         // G outputs per prompt
    clock.lap(&StepTimes::rollout);
    const auto rewards = run.score(prompts, samples);
    clock.lap(&StepTimes::reward);
    // With beta = 0 the loss has no KL term: the reference is not asked (as verl without a KL loss).
    const auto ref_logp = run.config().algo.kl_coef != 0 ? run.reference_logprobs(samples) : TensorView{};
    clock.lap(&StepTimes::reference);
    const auto advantages = run.advantages(rewards);                    // group-relative
    const auto batch = grpo_batch(samples, ref_logp, advantages, run.config());
    actors::TrainMetrics m;
    for (std::int32_t i = 0; i < std::max(1, run.config().algo.updates_per_batch); ++i) m = run.train(batch);   // mu steps
    clock.lap(&StepTimes::train);
    run.sync_weights();                                                 // pi_old <- pi_theta
    clock.lap(&StepTimes::sync);
    StepRecord rec = run.record(samples, rewards, m, clock);
    rec.values["update_rows"] = double(batch.tokens.shape.empty() ? 0 : batch.tokens.shape[0]);   // the groups with a gradient
    return rec;
  }
};

}  // namespace

std::unique_ptr<Algorithm> detail::make_grpo(const RunConfig& config) { return std::make_unique<Grpo>(config); }

}  // namespace troupe::rl
