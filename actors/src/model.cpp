#include "troupe/actors/model.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "troupe/actors/policy.hpp"
#include "troupe/actors/tensor_bridge.hpp"
#include "troupe/named_registry.hpp"

namespace troupe::actors {

namespace {

NamedRegistry<ModelFactory>& registry() {
  static NamedRegistry<ModelFactory> r("model architecture");
  static const bool builtins [[maybe_unused]] =   // named here so that the linker keeps policy.cpp
      (r.put("transformer", [](const PolicyConfig& c) -> std::unique_ptr<Model> { return std::make_unique<Policy>(c); }), true);
  return r;
}

// The tensor named `name` in `tensors`, checked against `like` (f32, same shape). A name given
// twice is refused: which one was meant is not known.
at::Tensor checked_tensor(const NamedTensors& tensors, const std::string& name, const at::Tensor& like) {
  const TensorView* found = nullptr;
  for (auto& [n, t] : tensors) {
    if (n != name) continue;
    if (found != nullptr) throw std::invalid_argument("model weights: parameter '" + name + "' is given twice");
    found = &t;
  }
  if (found == nullptr) throw std::invalid_argument("model weights: missing parameter '" + name + "'");
  if (found->dtype != DType::F32) throw std::invalid_argument("model weights: '" + name + "' is not f32");
  if (found->shape != std::vector<std::int64_t>(like.sizes().begin(), like.sizes().end()))
    throw std::invalid_argument("model weights: '" + name + "' has the wrong shape");
  return from_view(*found);
}

void check_count(const NamedTensors& tensors, std::size_t expected) {
  if (tensors.size() != expected)
    throw std::invalid_argument("model weights: " + std::to_string(tensors.size()) + " tensors for " +
                                std::to_string(expected) + " parameters");
}

}  // namespace

Model::Model(PolicyConfig config) : config_(std::move(config)) {
  const auto& heads = config_.scalar_heads;
  for (const auto& h : heads) {
    if (h.empty() || h == "lm" || std::count(heads.begin(), heads.end(), h) > 1)
      throw std::invalid_argument("PolicyConfig: scalar head names must be distinct, non-empty and not 'lm'");
  }
}

std::unique_ptr<DecodeCache> Model::make_cache(std::int64_t, std::int64_t) const { return nullptr; }

bool DecodeCache::repeat_rows(const DecodeCache&, std::int64_t, std::int64_t) { return false; }
bool DecodeCache::reuse(std::int64_t, std::int64_t) { return false; }

void Model::add_scalar_heads(std::int64_t width, at::Generator& gen) {
  first_head_ = params_.size();
  for (const auto& h : config_.scalar_heads) {
    params_.emplace_back(h + "_head.weight", at::randn({1, width}, gen).mul_(1.0 / std::sqrt(double(width) + 1.0)));
    params_.emplace_back(h + "_head.bias", at::zeros({1}));
  }
}

std::map<std::string, at::Tensor> Model::scalar_heads_of(const at::Tensor& h) const {
  std::map<std::string, at::Tensor> out;
  for (std::size_t i = 0; i < config_.scalar_heads.size(); ++i) {
    const std::size_t w = first_head_ + 2 * i;
    out[config_.scalar_heads[i]] = at::linear(h, param(w), param(w + 1)).squeeze(-1);
  }
  return out;
}

std::int64_t Model::parameter_count() const {
  std::int64_t n = 0;
  for (auto& [name, t] : params_) n += t.numel();
  return n;
}

void Model::set_requires_grad(bool on) {
  for (auto& [name, t] : params_) t.requires_grad_(on);
}

std::vector<at::Tensor> Model::checked(const NamedTensors& tensors) const {
  check_count(tensors, params_.size());
  std::vector<at::Tensor> out;
  out.reserve(params_.size());
  for (auto& [name, p] : params_) out.push_back(checked_tensor(tensors, name, p));
  return out;
}

void Model::check(const NamedTensors& tensors) const { (void)checked(tensors); }

// Every tensor checked before any is copied: a file that does not fit changes nothing.
void Model::load(const NamedTensors& tensors) {
  const auto from = checked(tensors);
  at::NoGradGuard no_grad;
  for (std::size_t i = 0; i < params_.size(); ++i) params_[i].second.copy_(from[i]);
}

void Model::adopt(const NamedTensors& tensors) {
  check_count(tensors, params_.size());
  NamedParameters next;
  for (auto& [name, p] : params_) next.emplace_back(name, checked_tensor(tensors, name, p));
  params_ = std::move(next);
}

std::vector<std::string> Model::load_trunk(const NamedTensors& tensors) {
  std::vector<std::string> kept;
  std::vector<std::pair<std::size_t, at::Tensor>> from;   // all checked before any is copied, as in load
  for (std::size_t i = 0; i < params_.size(); ++i) {
    auto& [name, p] = params_[i];
    const bool head = !config_.scalar_heads.empty() && i >= first_head_;
    const bool present = std::any_of(tensors.begin(), tensors.end(), [&](const auto& t) { return t.first == name; });
    if (head && !present) {
      const std::string h = name.substr(0, name.rfind("_head."));
      if (kept.empty() || kept.back() != h) kept.push_back(h);
      continue;
    }
    from.emplace_back(i, checked_tensor(tensors, name, p));
  }
  at::NoGradGuard no_grad;
  for (auto& [i, t] : from) params_[i].second.copy_(t);
  return kept;
}

NamedTensors Model::views() const {
  NamedTensors out;
  out.reserve(params_.size());
  for (auto& [name, t] : params_) out.emplace_back(name, to_view(t));
  return out;
}

void register_model(const std::string& name, ModelFactory factory) { registry().put(name, std::move(factory)); }

std::vector<std::string> model_names() { return registry().names(); }

std::unique_ptr<Model> make_model(const PolicyConfig& config) { return registry().at(config.architecture)(config); }

}  // namespace troupe::actors
