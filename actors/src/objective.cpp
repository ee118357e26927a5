#include "troupe/actors/objective.hpp"

#include <ATen/ATen.h>

#include "troupe/named_registry.hpp"

namespace troupe::actors {
namespace {

NamedRegistry<Objective>& registry() {
  static NamedRegistry<Objective> r("objective");
  static const bool with_sft = (r.put("sft", &sft_objective), true);
  (void)with_sft;
  return r;
}

}  // namespace

void register_objective(const std::string& name, Objective objective) { registry().put(name, std::move(objective)); }

Objective find_objective(const std::string& name) { return registry().at(name); }

double option_or(const std::map<std::string, double>& options, const std::string& key, double fallback) {
  auto it = options.find(key);
  return it == options.end() ? fallback : it->second;
}

const at::Tensor& require_input(const ObjectiveInput& in, const std::string& key, const std::string& objective) {
  auto it = in.inputs.find(key);
  if (it == in.inputs.end()) throw std::invalid_argument(objective + " objective: missing input '" + key + "'");
  return it->second;
}

at::Tensor seq_mean_token_mean(const at::Tensor& x, const at::Tensor& mask) {
  auto m = mask.to(x.scalar_type());
  auto per_row = (x * m).sum(1) / m.sum(1).clamp_min(1.0);
  return per_row.mean();
}

ObjectiveOutput sft_objective(const ObjectiveInput& in) {
  ObjectiveOutput out;
  out.loss = seq_mean_token_mean(-in.logp, in.loss_mask);
  out.metrics["nll"] = out.loss.item<double>();
  return out;
}

}  // namespace troupe::actors
