// The math of the GRPO loss as pure functions over tensors (advantages: advantages.hpp) (verl's core_algos, in C++). Forward values come
// from troupe::kernels; gradients from the kernels' analytic gradient, attached with the identity
//   y = kernel_value + (x * g).sum() - (x * g).sum().detach()
// whose value is kernel_value and whose gradient with respect to x is g (no custom autograd node).
// Include only from torch-using sources.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "troupe/actors/objective.hpp"

namespace troupe::rl {

// k3 estimator of KL(pi || ref) per token (Schulman 2020, http://joschu.net/blog/kl-approx.html):
//   k3 = exp(ref - logp) - (ref - logp) - 1,  ref - logp clamped to [-20, 20].
// logp, ref_logp [n, T] f32, mask [n, T] bool -> [n, T] f32, 0 off the mask; differentiable in logp.
at::Tensor kl_k3(const at::Tensor& logp, const at::Tensor& ref_logp, const at::Tensor& mask);

// PPO's clipped surrogate (Schulman et al. 2017, arXiv:1707.06347) aggregated as in the GRPO paper:
// per token l_t = max(-A r_t, -A clip(r_t, 1 - eps, 1 + eps)), r_t = exp(logp_t - old_logp_t);
// loss = (1/n) sum_rows (1/|o|) sum_t l_t. logp [n, T] (differentiable), old_logp [n, T],
// advantages [n] (one per sequence), mask [n, T] bool.
struct PolicyLoss {
  at::Tensor loss;             // scalar, differentiable in logp
  double clip_fraction = 0;    // share of valid tokens where the clipped term was active
};
PolicyLoss clipped_policy_loss(const at::Tensor& logp, const at::Tensor& old_logp, const at::Tensor& advantages,
                               const at::Tensor& mask, double clip_eps);

// The GRPO objective for the Trainer:
//   L = clipped_policy_loss + kl_coef * (1/n) sum_rows (1/|o|) sum_t k3_t
// inputs: "old_logp" [n, T], "ref_logp" [n, T] (optional when kl_coef is 0), "advantages" [n];
// options: "clip_eps" (0.2), "kl_coef" (0.04). Metrics: pg_loss, kl (when ref_logp is given),
// clip_fraction. Without "old_logp" the update is
// on-policy: old = logp detached (the ratio is 1, its gradient the policy gradient), which is exact
// for one update per batch of samples from the trainer's own version (TRL's GRPO with
// num_iterations = 1 does the same; verl recomputes old logprobs with the actor for the reason
// below) and does not depend on the sampler's arithmetic: engines that batch the rows differently
// give logprobs that differ in their last bits.
actors::ObjectiveOutput grpo_objective(const actors::ObjectiveInput& in);

// Registers grpo_objective as "grpo" (also done at static initialisation; calling it is harmless).
void register_grpo_objective();

// PPO's policy objective (Schulman et al. 2017, arXiv:1707.06347, eq. 7) with per-token advantages
// (GAE): clipped_policy_loss. inputs: "old_logp" [n, T], "advantages" [n, T] (or [n]), optionally
// "ref_logp" (only reported: PPO puts the KL penalty in the rewards); option "clip_eps" (0.2).
// Metrics: pg_loss, clip_fraction, kl. Registered as "ppo".
actors::ObjectiveOutput ppo_objective(const actors::ObjectiveInput& in);

// The critic's objective: clipped_value_loss of the model's "value" head, token-aligned
// (actors::token_values_of), against inputs "returns" [n, T] with "old_values" [n, T] (the values
// the returns were computed with); option "value_clip" (0.2). Metrics: value_loss,
// value_clip_fraction. Registered as "value".
actors::ObjectiveOutput value_objective(const actors::ObjectiveInput& in);

// PPO's clipped value loss (the critic's; Schulman et al. 2017's baselines code, as OpenRLHF and
// verl use it): with v_clip = old_values + clamp(values - old_values, -clip, clip),
//   l_t = 0.5 * max((values_t - returns_t)^2, (v_clip_t - returns_t)^2)
// aggregated seq-mean-token-mean over mask. values [n, T] (differentiable), old_values and returns
// [n, T], mask [n, T] bool. clip <= 0: no clipping (the plain squared error). Metric-friendly
// clip_fraction: the share of valid tokens where the clipped term is the larger.
struct ValueLoss {
  at::Tensor loss;
  double clip_fraction = 0;
};
ValueLoss clipped_value_loss(const at::Tensor& values, const at::Tensor& old_values, const at::Tensor& returns,
                             const at::Tensor& mask, double clip);

// Preference losses over pairs: rows come in pairs, row 2k the chosen response to prompt k and row
// 2k+1 the rejected one (a micro-batch never splits a pair). s = sum_t mask * logp is a response's
// log-likelihood, ref_seq_logp [n] the reference policy's, and
//   h_k = (s_chosen - ref_chosen) - (s_rejected - ref_rejected)
// DPO (Rafailov et al. 2023, arXiv:2305.18290, eq. 7):  l_k = -log sigmoid(beta * h_k)
// IPO (Azar et al. 2023, arXiv:2310.12036, eq. 17):     l_k = (h_k - 1 / (2 beta))^2
// loss = the mean over pairs (so also over rows), differentiable in logp [n, T]; mask [n, T] bool.
// Throws std::invalid_argument for an odd row count or shapes that disagree.
struct PreferenceLoss {
  at::Tensor loss;               // scalar
  double reward_accuracy = 0;    // share of pairs with h > 0 (the implicit reward prefers the chosen)
  double reward_margin = 0;      // mean of beta * h
};
PreferenceLoss preference_loss(const at::Tensor& logp, const at::Tensor& mask, const at::Tensor& ref_seq_logp,
                               double beta, bool ipo);

// The DPO objective for the Trainer: preference_loss. inputs: "ref_seq_logp" [n]; options: "beta"
// (0.1), "ipo" (0: DPO, 1: IPO). Metrics: reward_accuracy, reward_margin. Registered as "dpo".
actors::ObjectiveOutput dpo_objective(const actors::ObjectiveInput& in);

// Bradley-Terry loss of a reward model (Bradley and Terry 1952; Ouyang et al. 2022,
// arXiv:2203.02155, eq. 1, with the optional margin of Touvron et al. 2023, arXiv:2307.09288,
// eq. 2): scores [2K] with each pair's chosen then rejected adjacent,
//   l_k = -log sigmoid(score_chosen - score_rejected - margin),  loss = mean over pairs.
// Differentiable in scores. Throws std::invalid_argument for an odd count.
at::Tensor bradley_terry_loss(const at::Tensor& scores, double margin = 0.0);

// The reward model's objective for the Trainer: bradley_terry_loss of the model's "score" head at
// each row's last real token, rows in pairs (chosen, rejected; row_group 2). Options: "margin" (0),
// "lm_coef" (0): adds lm_coef times the chosen rows' language-model loss (their loss-mask tokens'
// negative log-likelihood, seq-mean-token-mean, as "sft"), the regulariser of Yang et al. 2024,
// arXiv:2406.10216, which keeps the trunk a model of good answers. Metrics: pair_accuracy (share of
// pairs scored the right way round), score_margin (mean chosen - rejected), chosen_nll (with
// lm_coef). Registered as "bradley_terry".
actors::ObjectiveOutput bradley_terry_objective(const actors::ObjectiveInput& in);

}  // namespace troupe::rl
