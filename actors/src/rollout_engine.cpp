#include "troupe/actors/rollout_engine.hpp"

#include <ATen/ATen.h>

#include <chrono>

#include "troupe/actors/generate.hpp"
#include "troupe/actors/policy.hpp"
#include "troupe/actors/tensor_bridge.hpp"

namespace troupe::actors {

struct RolloutEngine::Impl {
  RolloutConfig config;
  Policy policy;
  std::int64_t version = 0;
  std::unique_ptr<WeightSubscriber> weights;   // pull_weights(): the store it follows
  std::uint64_t weights_store = 0;
  explicit Impl(RolloutConfig c) : config(std::move(c)), policy(config.policy) {}
};

RolloutEngine::RolloutEngine(RolloutConfig config) {
  set_compute_threads(config.threads);
  impl_ = std::make_unique<Impl>(std::move(config));
}
RolloutEngine::~RolloutEngine() = default;
RolloutEngine::RolloutEngine(RolloutEngine&&) noexcept = default;

RolloutBatch RolloutEngine::generate(GenerateRequest request) {
  const auto start = std::chrono::steady_clock::now();
  Generation g = actors::generate(impl_->policy, request.prompts, request.samples_per_prompt, request.sampling,
                                  impl_->config.use_cache, BatchPart{request.first_prompt, request.prompt_width});
  RolloutBatch b;
  b.tokens = to_view(g.tokens);
  b.attn_mask = to_view(g.attn_mask);
  b.response_mask = to_view(g.response_mask);
  b.logprobs = to_view(g.logprobs);
  b.policy_version.assign(g.responses.size(), impl_->version);
  b.responses = std::move(g.responses);
  b.finished = std::move(g.finished);
  b.prompt_len = g.prompt_len;
  b.generated_tokens = g.generated_tokens;
  b.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return b;
}

std::int64_t RolloutEngine::update_weights(Weights weights) {
  NamedTensors named;
  named.reserve(weights.names.size());
  for (std::size_t i = 0; i < weights.names.size() && i < weights.tensors.size(); ++i)
    named.emplace_back(weights.names[i], weights.tensors[i]);
  impl_->policy.adopt(named);
  impl_->version = weights.version;
  return impl_->version;
}

std::int64_t RolloutEngine::pull_weights(ActorRef<WeightStore> store) {
  if (!impl_->weights || impl_->weights_store != store.id()) {
    impl_->weights = std::make_unique<WeightSubscriber>(store);
    impl_->weights_store = store.id();
  }
  auto set = impl_->weights->update();
  NamedTensors named;
  named.reserve(set->tensors().size());
  for (const auto& t : set->tensors()) named.emplace_back(t.name, t.tensor);   // views: their keep_alive holds the version
  impl_->policy.adopt(named);
  impl_->version = std::int64_t(set->version()) - kStoreVersionOffset;
  return impl_->version;
}

std::int64_t RolloutEngine::policy_version() { return impl_->version; }

}  // namespace troupe::actors
