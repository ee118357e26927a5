#include "troupe/actors/optimizer.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "troupe/actors/tensor_bridge.hpp"

namespace troupe::actors {

AdamW::AdamW(const NamedParameters& params, const OptimConfig& config) : params_(params), config_(config) {
  for (auto& [name, p] : params_) {
    exp_avg_.push_back(at::zeros_like(p));
    exp_avg_sq_.push_back(at::zeros_like(p));
  }
}

double AdamW::clip_gradients() {
  at::NoGradGuard no_grad;
  double sq = 0;
  for (auto& [name, p] : params_) {
    if (p.grad().defined()) sq += p.grad().pow(2).sum().item<double>();
  }
  const double norm = std::sqrt(sq);
  if (config_.max_grad_norm > 0 && norm > config_.max_grad_norm) {
    const double scale = config_.max_grad_norm / (norm + 1e-6);
    for (auto& [name, p] : params_) if (p.grad().defined()) p.mutable_grad().mul_(scale);
  }
  return norm;
}

double AdamW::current_lr() const {
  if (config_.warmup_steps <= 0) return config_.lr;
  return config_.lr * std::min(1.0, double(steps_ + 1) / double(config_.warmup_steps));
}

// torch.optim.AdamW's update, step by step.
double AdamW::step() {
  at::NoGradGuard no_grad;
  const double lr = current_lr();
  ++steps_;
  const double bc1 = 1.0 - std::pow(config_.beta1, double(steps_));
  const double bc2 = 1.0 - std::pow(config_.beta2, double(steps_));
  for (std::size_t i = 0; i < params_.size(); ++i) {
    auto& p = params_[i].second;
    if (!p.grad().defined()) continue;
    const auto& g = p.grad();
    if (config_.weight_decay != 0) p.mul_(1.0 - lr * config_.weight_decay);
    exp_avg_[i].mul_(config_.beta1).add_(g, 1.0 - config_.beta1);
    exp_avg_sq_[i].mul_(config_.beta2).addcmul_(g, g, 1.0 - config_.beta2);
    auto denom = (exp_avg_sq_[i].sqrt() / std::sqrt(bc2)).add_(config_.eps);
    p.addcdiv_(exp_avg_[i], denom, -lr / bc1);
  }
  zero_grad();
  return lr;
}

void AdamW::zero_grad() {
  for (auto& [name, p] : params_) {
    if (p.grad().defined()) p.mutable_grad().zero_();
  }
}

NamedTensors AdamW::state_views() const {
  NamedTensors out;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    out.emplace_back("exp_avg." + params_[i].first, to_view(exp_avg_[i]));
    out.emplace_back("exp_avg_sq." + params_[i].first, to_view(exp_avg_sq_[i]));
  }
  return out;
}

std::map<std::string, std::string> AdamW::state_metadata() const { return {{"steps", std::to_string(steps_)}}; }

void AdamW::load_state(const SafetensorsFile& file) {
  at::NoGradGuard no_grad;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    std::vector<std::int64_t> shape(params_[i].second.sizes().begin(), params_[i].second.sizes().end());
    exp_avg_[i].copy_(from_view(file.require("exp_avg." + params_[i].first, shape)));
    exp_avg_sq_[i].copy_(from_view(file.require("exp_avg_sq." + params_[i].first, shape)));
  }
  auto it = file.metadata.find("steps");
  if (it == file.metadata.end()) throw std::invalid_argument("optimizer state has no 'steps'");
  steps_ = std::stoll(it->second);
}

}  // namespace troupe::actors
