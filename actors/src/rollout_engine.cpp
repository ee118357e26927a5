#include "troupe/actors/rollout_engine.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>

#include "troupe/actors/generate.hpp"
#include "troupe/actors/policy.hpp"
#include "troupe/actors/tensor_bridge.hpp"

namespace troupe::actors {

struct RolloutEngine::Impl {
  RolloutConfig config;
  std::unique_ptr<Model> policy;
  std::int64_t version = 0;
  std::unique_ptr<WeightSubscriber> weights;   // pull_weights(): the store it follows
  std::unique_ptr<DecodeCache> cache;   // the last generate's, reused by the next (generate()'s keep)
  std::uint64_t weights_store = 0;
  explicit Impl(RolloutConfig c) : config(std::move(c)), policy(make_model(config.policy)) {}
};

RolloutEngine::RolloutEngine(RolloutConfig config) {
  set_compute_threads(config.threads, config.blas_threads);
  impl_ = std::make_unique<Impl>(std::move(config));
}
RolloutEngine::~RolloutEngine() = default;
RolloutEngine::RolloutEngine(RolloutEngine&&) noexcept = default;

RolloutBatch RolloutEngine::generate(GenerateRequest request) {
  const ComputeScope scope(impl_->config.threads);
  const auto start = std::chrono::steady_clock::now();
  Generation g = actors::generate(*impl_->policy, request.prompts, request.samples_per_prompt, request.sampling,
                                  impl_->config.use_cache, BatchPart{std::move(request.prompt_index), request.prompt_width},
                                  &impl_->cache);
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
  impl_->policy->adopt(named);
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
  impl_->policy->adopt(named);
  impl_->version = std::int64_t(set->version()) - kStoreVersionOffset;
  return impl_->version;
}

std::int64_t RolloutEngine::policy_version() { return impl_->version; }

RolloutBatch merge_rollouts(const std::vector<RolloutPart>& parts, std::int32_t samples) {
  if (samples < 1) throw std::invalid_argument("merge_rollouts: samples must be at least 1");
  std::size_t prompts = 0;
  std::int64_t width = 0;
  for (const auto& part : parts) {
    prompts += part.prompt_index.size();
    if (part.batch.tokens.shape.size() != 2 || part.batch.tokens.shape[0] != std::int64_t(part.prompt_index.size()) * samples)
      throw std::invalid_argument("merge_rollouts: a part's rows do not match its prompts");
    if (part.batch.prompt_len != parts.front().batch.prompt_len)
      throw std::invalid_argument("merge_rollouts: the parts were laid out with different prompt widths");
    width = std::max(width, part.batch.tokens.shape[1]);
  }
  std::vector<char> seen(prompts, 0);
  for (const auto& part : parts) {
    for (auto p : part.prompt_index) {
      if (p < 0 || std::size_t(p) >= prompts || seen[std::size_t(p)]++)
        throw std::invalid_argument("merge_rollouts: prompt " + std::to_string(p) + " is not covered exactly once");
    }
  }
  const std::int64_t rows = std::int64_t(prompts) * samples;
  auto tokens = at::zeros({rows, width}, at::kLong), attn = at::zeros({rows, width}, at::kBool),
       response = at::zeros({rows, width}, at::kBool), logprobs = at::zeros({rows, width}, at::kFloat);
  RolloutBatch out;
  std::vector<std::span<const std::int32_t>> responses(static_cast<std::size_t>(rows));   // in row order at the end
  std::size_t response_tokens = 0;
  out.finished.resize(std::size_t(rows));
  out.policy_version.resize(std::size_t(rows));
  out.prompt_len = parts.empty() ? 0 : parts.front().batch.prompt_len;
  for (const auto& part : parts) {
    const auto& b = part.batch;
    std::vector<std::int64_t> dest;
    dest.reserve(part.prompt_index.size() * std::size_t(samples));
    for (auto p : part.prompt_index)
      for (std::int32_t s = 0; s < samples; ++s) dest.push_back(p * samples + s);
    auto at_rows = at::tensor(dest, at::kLong);
    const std::int64_t pad = width - b.tokens.shape[1];
    auto place = [&](at::Tensor& into, const TensorView& v) { into.index_copy_(0, at_rows, at::constant_pad_nd(from_view(v), {0, pad}, 0)); };
    place(tokens, b.tokens);
    place(attn, b.attn_mask);
    place(response, b.response_mask);
    place(logprobs, b.logprobs);
    for (std::size_t r = 0; r < dest.size(); ++r) {
      const auto to = std::size_t(dest[r]);
      responses[to] = b.responses.at(r);
      response_tokens += responses[to].size();
      out.finished[to] = b.finished.at(r);
      out.policy_version[to] = b.policy_version.at(r);
    }
    out.generated_tokens += b.generated_tokens;
    out.seconds = std::max(out.seconds, b.seconds);
  }
  out.responses.reserve(responses.size(), response_tokens);
  for (auto row : responses) out.responses.push_back(row);
  out.tokens = to_view(tokens);
  out.attn_mask = to_view(attn);
  out.response_mask = to_view(response);
  out.logprobs = to_view(logprobs);
  return out;
}

}  // namespace troupe::actors
