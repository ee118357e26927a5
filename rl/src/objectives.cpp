#include "troupe/rl/objectives.hpp"

#include <ATen/ATen.h>

#include <stdexcept>
#include <string>

#include "troupe/actors/policy.hpp"
#include "troupe/kernels/kl.hpp"
#include "troupe/kernels/policy_loss.hpp"
#include "builtin_algorithms.hpp"

namespace troupe::rl {
namespace {

void check(const kernels::Status& st, const char* what) {
  if (!st.ok()) throw ErrorException(Error{st.error().code, std::string(what) + ": " + st.error().message});
}

// A scalar whose value is `value` and whose gradient with respect to x is g.
at::Tensor with_gradient(const at::Tensor& x, const at::Tensor& value, const at::Tensor& g) {
  auto surrogate = (x * g).sum();
  return value + surrogate - surrogate.detach();
}

at::Tensor bytes_of(const at::Tensor& mask) { return mask.to(at::kByte).contiguous(); }

// The kernels read `t` by `like`'s shape: it must be that shape (the trainer checks its batch;
// these are public functions too).
void same_shape(const at::Tensor& t, const at::Tensor& like, const char* fn, const char* name) {
  if (t.sizes() != like.sizes()) throw std::invalid_argument(std::string(fn) + ": " + name + " must have logp's shape");
}

}  // namespace

at::Tensor kl_k3(const at::Tensor& logp, const at::Tensor& ref_logp, const at::Tensor& mask) {
  same_shape(ref_logp, logp, "kl_k3", "ref_logp");
  same_shape(mask, logp, "kl_k3", "mask");
  auto lp = logp.detach().contiguous(), ref = ref_logp.to(at::kFloat).contiguous(), m = bytes_of(mask);
  auto value = at::empty_like(lp);
  kernels::KlOptions opts;   // k3, log-ratio clamp 20
  check(kernels::kl_penalty(lp.data_ptr<float>(), ref.data_ptr<float>(), m.data_ptr<std::uint8_t>(), lp.numel(),
                            value.data_ptr<float>(), opts), "kl_penalty");
  if (!logp.requires_grad()) return value;
  // d k3 / d logp = 1 - exp(u), u = ref - logp, inside the clamp; 0 where it clamps or off the mask.
  auto u = ref - lp;
  auto grad = (1.0 - u.exp()).mul_(u.abs().le(opts.log_ratio_clamp).logical_and(mask).to(at::kFloat));
  return value + logp * grad - (logp * grad).detach();   // elementwise value, elementwise gradient
}

PolicyLoss clipped_policy_loss(const at::Tensor& logp, const at::Tensor& old_logp, const at::Tensor& advantages,
                               const at::Tensor& mask, double clip_eps) {
  if (logp.dim() != 2) throw std::invalid_argument("clipped_policy_loss: logp must be [n, T]");
  same_shape(old_logp, logp, "clipped_policy_loss", "old_logp");
  same_shape(mask, logp, "clipped_policy_loss", "mask");
  const std::int64_t rows = logp.size(0), tokens = logp.size(1);
  auto lp = logp.detach().contiguous(), old = old_logp.to(at::kFloat).contiguous(), m = bytes_of(mask);
  auto adv = (advantages.dim() == 2 ? advantages.to(at::kFloat) : advantages.to(at::kFloat).view({rows, 1}).expand({rows, tokens}))
                 .contiguous();
  if (adv.sizes() != logp.sizes()) throw std::invalid_argument("clipped_policy_loss: advantages are [n] or [n, T]");
  auto loss = at::zeros({}, at::kFloat), grad = at::empty_like(lp);
  float clip_fraction = 0;
  kernels::PolicyLossOptions opts;
  opts.clip_low = opts.clip_high = float(clip_eps);
  opts.aggregation = kernels::LossAggregation::kSeqMeanTokenMean;
  check(kernels::policy_loss(lp.data_ptr<float>(), old.data_ptr<float>(), adv.data_ptr<float>(),
                             m.data_ptr<std::uint8_t>(), rows, tokens, loss.data_ptr<float>(), grad.data_ptr<float>(),
                             &clip_fraction, opts), "policy_loss");
  return PolicyLoss{with_gradient(logp, loss, grad), clip_fraction};
}

actors::ObjectiveOutput grpo_objective(const actors::ObjectiveInput& in) {
  const double clip_eps = actors::option_or(in.options, "clip_eps", 0.2);
  const double kl_coef = actors::option_or(in.options, "kl_coef", 0.04);
  auto need = [&](const char* k) -> const at::Tensor& { return actors::require_input(in, k, "grpo"); };
  const auto old = in.inputs.find("old_logp");
  PolicyLoss pg = clipped_policy_loss(in.logp, old != in.inputs.end() ? old->second : in.logp.detach(), need("advantages"),
                                      in.loss_mask, clip_eps);
  actors::ObjectiveOutput out;
  out.loss = pg.loss;
  if (kl_coef != 0 || in.inputs.count("ref_logp") != 0) {   // with kl_coef 0 the reference is optional (only reported)
    auto kl = actors::seq_mean_token_mean(kl_k3(in.logp, need("ref_logp"), in.loss_mask), in.loss_mask);
    if (kl_coef != 0) out.loss = pg.loss + kl_coef * kl;
    out.metrics["kl"] = kl.item<double>();
  }
  out.metrics["pg_loss"] = pg.loss.item<double>();
  out.metrics["clip_fraction"] = pg.clip_fraction;
  return out;
}

void register_grpo_objective() { actors::register_objective("grpo", &grpo_objective); }

bool detail::objective_registered(const std::string& name) {
  try {
    (void)actors::find_objective(name);
    return true;
  } catch (const std::invalid_argument&) {
    return false;
  }
}

bool detail::is_grpo_objective(const std::string& name) {
  try {
    const actors::Objective f = actors::find_objective(name);
    const auto* fn = f.target<actors::ObjectiveOutput (*)(const actors::ObjectiveInput&)>();
    return fn != nullptr && *fn == &grpo_objective;
  } catch (const std::exception&) {   // not registered: the trainer will say so
    return false;
  }
}

actors::ObjectiveOutput ppo_objective(const actors::ObjectiveInput& in) {
  auto need = [&](const char* k) -> const at::Tensor& { return actors::require_input(in, k, "ppo"); };
  PolicyLoss pg = clipped_policy_loss(in.logp, need("old_logp"), need("advantages"), in.loss_mask,
                                      actors::option_or(in.options, "clip_eps", 0.2));
  actors::ObjectiveOutput out;
  out.loss = pg.loss;
  out.metrics["pg_loss"] = pg.loss.item<double>();
  out.metrics["clip_fraction"] = pg.clip_fraction;
  if (auto ref = in.inputs.find("ref_logp"); ref != in.inputs.end())   // reported; the penalty is in the rewards
    out.metrics["kl"] = actors::seq_mean_token_mean(kl_k3(in.logp.detach(), ref->second, in.loss_mask), in.loss_mask).item<double>();
  return out;
}

actors::ObjectiveOutput value_objective(const actors::ObjectiveInput& in) {
  auto head = in.heads.find("value");
  if (head == in.heads.end()) throw std::invalid_argument("value objective: the model has no 'value' head");
  auto need = [&](const char* k) -> const at::Tensor& { return actors::require_input(in, k, "value"); };
  ValueLoss vl = clipped_value_loss(actors::token_values_of(head->second), need("old_values").to(at::kFloat),
                                    need("returns").to(at::kFloat), in.loss_mask, actors::option_or(in.options, "value_clip", 0.2));
  actors::ObjectiveOutput out;
  out.loss = vl.loss;
  out.metrics["value_loss"] = vl.loss.item<double>();
  out.metrics["value_clip_fraction"] = vl.clip_fraction;
  return out;
}

ValueLoss clipped_value_loss(const at::Tensor& values, const at::Tensor& old_values, const at::Tensor& returns,
                             const at::Tensor& mask, double clip) {
  if (values.dim() != 2 || old_values.sizes() != values.sizes() || returns.sizes() != values.sizes() ||
      mask.sizes() != values.sizes()) {
    throw std::invalid_argument("clipped_value_loss: values, old_values, returns and mask must all be [n, T]");
  }
  auto plain = (values - returns).pow(2);
  ValueLoss out;
  if (clip <= 0) {
    out.loss = actors::seq_mean_token_mean(0.5 * plain, mask);
    return out;
  }
  auto clipped_v = old_values + (values - old_values).clamp(-clip, clip);
  auto clipped = (clipped_v - returns).pow(2);
  out.loss = actors::seq_mean_token_mean(0.5 * at::max(plain, clipped), mask);
  auto m = mask.to(at::kBool);
  const double valid = m.sum().item<double>();
  out.clip_fraction = valid > 0 ? (clipped.detach().gt(plain.detach()).logical_and(m)).sum().item<double>() / valid : 0.0;
  return out;
}

namespace {

// Row pairs of x [2K, ...]: (chosen rows, rejected rows).
std::pair<at::Tensor, at::Tensor> pairs_of(const at::Tensor& x, const char* who) {
  if (x.dim() < 1 || x.size(0) % 2 != 0) {
    throw std::invalid_argument(std::string(who) + ": rows come in (chosen, rejected) pairs: an even count, not " +
                                std::to_string(x.dim() < 1 ? 0 : x.size(0)));
  }
  return {x.slice(0, 0, x.size(0), 2), x.slice(0, 1, x.size(0), 2)};
}

}  // namespace

PreferenceLoss preference_loss(const at::Tensor& logp, const at::Tensor& mask, const at::Tensor& ref_seq_logp,
                               double beta, bool ipo) {
  if (logp.dim() != 2 || mask.sizes() != logp.sizes() || ref_seq_logp.dim() != 1 || ref_seq_logp.size(0) != logp.size(0)) {
    throw std::invalid_argument("preference_loss: logp and mask [n, T], ref_seq_logp [n]");
  }
  if (!(beta > 0)) throw std::invalid_argument("preference_loss: beta must be > 0");
  auto seq = (logp * mask.to(logp.scalar_type())).sum(1) - ref_seq_logp.to(logp.scalar_type());
  auto [chosen, rejected] = pairs_of(seq, "preference_loss");
  auto h = chosen - rejected;
  PreferenceLoss out;
  out.loss = ipo ? (h - 1.0 / (2.0 * beta)).pow(2).mean() : -at::log_sigmoid(beta * h).mean();
  auto hd = h.detach();
  out.reward_accuracy = hd.gt(0).to(at::kFloat).mean().item<double>();
  out.reward_margin = (beta * hd).mean().item<double>();
  return out;
}

actors::ObjectiveOutput dpo_objective(const actors::ObjectiveInput& in) {
  auto pl = preference_loss(in.logp, in.loss_mask, actors::require_input(in, "ref_seq_logp", "dpo"), actors::option_or(in.options, "beta", 0.1),
                            actors::option_or(in.options, "ipo", 0.0) != 0.0);
  actors::ObjectiveOutput out;
  out.loss = pl.loss;
  out.metrics["reward_accuracy"] = pl.reward_accuracy;
  out.metrics["reward_margin"] = pl.reward_margin;
  return out;
}

at::Tensor bradley_terry_loss(const at::Tensor& scores, double margin) {
  auto [chosen, rejected] = pairs_of(scores.reshape({-1}), "bradley_terry_loss");
  return -at::log_sigmoid(chosen - rejected - margin).mean();
}

actors::ObjectiveOutput bradley_terry_objective(const actors::ObjectiveInput& in) {
  auto head = in.heads.find("score");
  if (head == in.heads.end()) throw std::invalid_argument("bradley_terry objective: the model has no 'score' head");
  const auto scores = head->second.gather(1, actors::last_token_index(in.attn_mask).view({-1, 1})).view({-1});
  actors::ObjectiveOutput out;
  out.loss = bradley_terry_loss(scores, actors::option_or(in.options, "margin", 0.0));
  if (const double lm_coef = actors::option_or(in.options, "lm_coef", 0.0); lm_coef != 0.0) {
    auto [chosen_logp, rejected_logp] = pairs_of(in.logp, "bradley_terry objective");
    auto [chosen_mask, rejected_mask] = pairs_of(in.loss_mask, "bradley_terry objective");
    const auto nll = actors::seq_mean_token_mean(-chosen_logp, chosen_mask);
    out.loss = out.loss + lm_coef * nll;
    out.metrics["chosen_nll"] = nll.detach().to(at::kDouble).item<double>();
  }
  auto [chosen, rejected] = pairs_of(scores.detach(), "bradley_terry objective");
  out.metrics["pair_accuracy"] = chosen.gt(rejected).to(at::kDouble).mean().item<double>();
  out.metrics["score_margin"] = (chosen - rejected).to(at::kDouble).mean().item<double>();
  return out;
}

TROUPE_OBJECTIVE("grpo", &grpo_objective);
TROUPE_OBJECTIVE("ppo", &ppo_objective);
TROUPE_OBJECTIVE("value", &value_objective);
TROUPE_OBJECTIVE("dpo", &dpo_objective);
TROUPE_OBJECTIVE("bradley_terry", &bradley_terry_objective);

}  // namespace troupe::rl
