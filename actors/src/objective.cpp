#include "troupe/actors/objective.hpp"

#include <ATen/ATen.h>

#include <mutex>
#include <stdexcept>

namespace troupe::actors {
namespace {

struct Registry {
  std::mutex mu;
  std::map<std::string, Objective> objectives{{"sft", &sft_objective}};
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

void register_objective(const std::string& name, Objective objective) {
  auto& r = registry();
  std::lock_guard lk(r.mu);
  r.objectives[name] = std::move(objective);
}

Objective find_objective(const std::string& name) {
  auto& r = registry();
  std::lock_guard lk(r.mu);
  auto it = r.objectives.find(name);
  if (it == r.objectives.end()) throw std::invalid_argument("no objective registered as '" + name + "'");
  return it->second;
}

double option_or(const std::map<std::string, double>& options, const std::string& key, double fallback) {
  auto it = options.find(key);
  return it == options.end() ? fallback : it->second;
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
