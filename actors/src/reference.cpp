#include "troupe/actors/reference.hpp"

#include <ATen/ATen.h>

#include "troupe/actors/policy.hpp"
#include "troupe/actors/safetensors.hpp"
#include "troupe/actors/tensor_bridge.hpp"

namespace troupe::actors {

struct Reference::Impl {
  ReferenceConfig config;
  std::unique_ptr<Model> policy;
  explicit Impl(ReferenceConfig c) : config(std::move(c)), policy(make_model(config.policy)) {}
};

Reference::Reference(ReferenceConfig config) {
  set_compute_threads(config.threads, config.blas_threads);
  impl_ = std::make_unique<Impl>(std::move(config));
  if (!impl_->config.weights_path.empty()) load_weights(impl_->config.weights_path);
}
Reference::~Reference() = default;
Reference::Reference(Reference&&) noexcept = default;

TensorView Reference::logprobs(LogprobRequest request) {
  const ComputeScope scope(impl_->config.threads);
  at::NoGradGuard no_grad;
  auto lp = token_logprobs(*impl_->policy, from_view(request.tokens), from_view(request.attn_mask), request.temperature);
  return to_view(lp);
}

void Reference::load_weights(std::string path) {
  auto file = read_safetensors(path);
  impl_->policy->adopt(file.tensors);
}

}  // namespace troupe::actors
