#include "troupe/actors/optimizer.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <charconv>
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

// The step count and each parameter's two moments in `file`, checked: f32 with the parameter's
// shape, finite, the second moment never negative, the count a whole number >= 0 (a count of -1
// made the next step's bias correction divide by zero and every parameter NaN).
AdamW::LoadedState AdamW::checked_state(const SafetensorsFile& file) const {
  LoadedState s;
  auto it = file.metadata.find("steps");
  if (it == file.metadata.end()) throw std::invalid_argument("optimizer state has no 'steps'");
  const std::string& text = it->second;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), s.steps);
  if (ec != std::errc() || end != text.data() + text.size() || s.steps < 0)
    throw std::invalid_argument("optimizer state: 'steps' is '" + text + "', not a whole number >= 0");
  for (std::size_t i = 0; i < params_.size(); ++i) {
    std::vector<std::int64_t> shape(params_[i].second.sizes().begin(), params_[i].second.sizes().end());
    for (const bool second : {false, true}) {
      const std::string name = (second ? "exp_avg_sq." : "exp_avg.") + params_[i].first;
      const TensorView& v = file.require(name, shape);
      if (v.dtype != DType::F32) throw std::invalid_argument("optimizer state: '" + name + "' is not f32");
      at::Tensor t = from_view(v);
      if (!at::isfinite(t).all().item<bool>()) throw std::invalid_argument("optimizer state: '" + name + "' is not finite");
      if (second && t.lt(0).any().item<bool>()) throw std::invalid_argument("optimizer state: '" + name + "' is negative");
      (second ? s.exp_avg_sq : s.exp_avg).push_back(std::move(t));
    }
  }
  return s;
}

void AdamW::check_state(const SafetensorsFile& file) const { (void)checked_state(file); }

void AdamW::load_state(const SafetensorsFile& file) {
  LoadedState s = checked_state(file);   // all of it before any of it: a bad file changes nothing
  at::NoGradGuard no_grad;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    exp_avg_[i].copy_(s.exp_avg[i]);
    exp_avg_sq_[i].copy_(s.exp_avg_sq[i]);
  }
  steps_ = s.steps;
}

}  // namespace troupe::actors
