// Training objectives, registered by name so that the Trainer stays algorithm-agnostic: rl/
// registers "grpo", "ppo", "value", "dpo", "bradley_terry"; actors/ itself provides "sft"; a
// program registers its own with TROUPE_OBJECTIVE. Include only from torch-using sources.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <string>

namespace troupe::actors {

// One micro-batch of n rows.
struct ObjectiveInput {
  at::Tensor logp;        // [n, T] f32, differentiable: log pi(tokens[:, t] | tokens[:, <t]); column 0 is 0
  at::Tensor loss_mask;   // [n, T] bool
  std::map<std::string, at::Tensor> inputs;   // the batch's objective inputs, these rows
  std::map<std::string, double> options;
  at::Tensor attn_mask;   // [n, T] bool: real tokens (last_token_index finds each row's last)
  std::map<std::string, at::Tensor> heads;    // [n, T] f32, differentiable: the model's scalar heads, by name
};

struct ObjectiveOutput {
  // Scalar. Must be a mean over this micro-batch's rows (each row weighted equally), so that the
  // Trainer's accumulation, which weights micro-batch k by n_k / N, gives the full-batch loss.
  at::Tensor loss;
  std::map<std::string, double> metrics;   // means over the rows, accumulated the same way
};

using Objective = std::function<ObjectiveOutput(const ObjectiveInput&)>;

// Registration is thread-safe; a later registration under the same name replaces the earlier.
void register_objective(const std::string& name, Objective objective);
// Throws std::invalid_argument for an unknown name.
Objective find_objective(const std::string& name);

// The option `key`, or `fallback` when absent.
double option_or(const std::map<std::string, double>& options, const std::string& key, double fallback);
// The input `key`; std::invalid_argument "<objective> objective: missing input '<key>'" when absent.
const at::Tensor& require_input(const ObjectiveInput& in, const std::string& key, const std::string& objective);

// Sequence-mean of token-means: (1/n) sum_rows (sum_t mask * x) / max(1, sum_t mask). x, mask [n, T].
at::Tensor seq_mean_token_mean(const at::Tensor& x, const at::Tensor& mask);

// "sft": negative log-likelihood of the loss-mask tokens, seq-mean-token-mean. Metric "nll".
ObjectiveOutput sft_objective(const ObjectiveInput& in);

}  // namespace troupe::actors

#define TROUPE_DETAIL_OBJ_CAT2(a, b) a##b
#define TROUPE_DETAIL_OBJ_CAT(a, b) TROUPE_DETAIL_OBJ_CAT2(a, b)
// Registers `fn` (an Objective) as `name` at static initialisation: at namespace scope, so that a
// worker process of the program (the same binary, which never runs main) has it too.
#define TROUPE_OBJECTIVE(name, fn)                                                                 \
  static const bool TROUPE_DETAIL_OBJ_CAT(troupe_objective_, __COUNTER__) [[maybe_unused]] =         \
      (::troupe::actors::register_objective(name, fn), true)
