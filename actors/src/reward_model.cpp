#include "troupe/actors/reward_model.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <stdexcept>

#include "troupe/actors/policy.hpp"
#include "troupe/actors/safetensors.hpp"
#include "troupe/actors/tensor_bridge.hpp"

namespace troupe::actors {

struct RewardModel::Impl {
  RewardModelConfig config;
  std::unique_ptr<Model> model;
  explicit Impl(RewardModelConfig c) : config(std::move(c)), model(make_model(checked(config.model))) {}
  static const PolicyConfig& checked(const PolicyConfig& c) {
    if (std::find(c.scalar_heads.begin(), c.scalar_heads.end(), "score") == c.scalar_heads.end())
      throw std::invalid_argument("RewardModel: the model has no \"score\" head");
    return c;
  }
};

RewardModel::RewardModel(RewardModelConfig config) {
  set_compute_threads(config.threads, config.blas_threads);
  impl_ = std::make_unique<Impl>(std::move(config));
  if (!impl_->config.weights_path.empty()) load_weights(impl_->config.weights_path);
}
RewardModel::~RewardModel() = default;
RewardModel::RewardModel(RewardModel&&) noexcept = default;

std::vector<float> RewardModel::score(SequenceBatch batch) {
  const ComputeScope scope(impl_->config.threads);
  at::NoGradGuard no_grad;
  const auto tokens = from_view(batch.tokens), attn = from_view(batch.attn_mask);
  if (tokens.dim() != 2 || attn.sizes() != tokens.sizes()) throw std::invalid_argument("RewardModel::score: tokens and attn_mask must be [N, T]");
  auto out = impl_->model->forward_outputs(tokens, positions_from_mask(attn), attn, /*logits=*/false);
  auto scores = out.heads.at("score").gather(1, last_token_index(attn).view({-1, 1})).view({-1}).contiguous();
  return std::vector<float>(scores.data_ptr<float>(), scores.data_ptr<float>() + scores.numel());
}

void RewardModel::load_weights(std::string path) { impl_->model->load(read_safetensors(path).tensors); }

}  // namespace troupe::actors
