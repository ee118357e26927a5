// The Trainer batches of the library's algorithms as pure functions of a step's samples
// (torch-free): the algorithms' files (rl/src/grpo.cpp, ppo.cpp, dpo.cpp) build their updates with
// them, and so can a plain loop doing the same math (bench/rl/rl_step) or a user's algorithm.
// DPO's batch is batches.hpp's dpo_batch.
#pragma once

#include <cstdint>
#include <vector>

#include "troupe/actors/types.hpp"
#include "troupe/rl/run.hpp"

namespace troupe::rl {

// GRPO's update (Shao et al. 2024, arXiv:2402.03300, Algorithm 1): tokens and masks of the
// samples, the loss on the response, inputs ref_logp [N, T] (left out when it is an empty view: a
// run with kl_coef 0 asks no reference) and advantages [N] (one per row), and
// old_logp (the sampler's) when there are several updates per batch (mu > 1); with one, the update
// is on-policy and its math does not depend on which engines sampled (grpo_objective). Objective
// config.objective with clip_eps and kl_coef; a prompt's G samples stay in one micro-batch. With
// config.algo.skip_zero_advantage, kl_coef 0 and the "grpo" objective, the groups whose advantages
// are all 0 (no gradient) are left out and loss_rows is N: the same update, computed on fewer rows.
actors::TrainBatch grpo_batch(const actors::RolloutBatch& samples, const TensorView& ref_logp,
                              const std::vector<float>& advantages, const RunConfig& config);

// PPO's two updates for one batch of samples (Ouyang et al. 2022's RLHF recipe in the token-level
// form of OpenRLHF and verl): per-token rewards r_t = -kl_coef * (logp_old_t - logp_ref_t) on every
// response token plus the sample's reward at its last one, GAE (config.gae_gamma, gae_lambda) over
// the critic's `values` [N, T], advantages whitened over the batch's response tokens.
//   policy: objective "ppo", inputs old_logp, advantages [N, T], ref_logp; option clip_eps
//   critic: objective "value", inputs old_values (= values), returns [N, T]; option value_clip
struct PpoBatches {
  actors::TrainBatch policy, critic;
};
PpoBatches ppo_batches(const actors::RolloutBatch& samples, const TensorView& ref_logp, const TensorView& values,
                       const std::vector<actors::RewardResult>& rewards, double kl_coef, const RunConfig& config);

// The KL the adaptive controller measures (Ziegler et al. 2019): the mean over samples of
// sum_t (logp_old_t - logp_ref_t) over each response, in nats per sample.
double sampled_kl(const actors::RolloutBatch& samples, const TensorView& ref_logp);

}  // namespace troupe::rl
