// Batched autoregressive sampling from a Model, with or without its decode cache (the two give the same
// tokens: the cache only saves recomputation). Include only from torch-using sources.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "troupe/actors/policy.hpp"
#include "troupe/actors/types.hpp"

namespace troupe::actors {

// Tensors laid out as RolloutBatch describes (see types.hpp).
struct Generation {
  at::Tensor tokens;          // [N, T] i64
  at::Tensor attn_mask;       // [N, T] bool
  at::Tensor response_mask;   // [N, T] bool
  at::Tensor logprobs;        // [N, T] f32
  TokenRows responses;                 // stop token excluded
  std::vector<std::uint8_t> finished;
  std::int32_t prompt_len = 0;
  std::int64_t generated_tokens = 0;
};

// Where a request's rows sit in the whole batch they belong to (GenerateRequest's fields).
struct BatchPart {
  std::vector<std::int64_t> prompt_index;   // each prompt's index in the whole batch; empty: 0, 1, ...
  std::int32_t prompt_width = 0;            // the whole batch's longest prompt; 0: these prompts' longest
};

// Samples `samples_per_prompt` continuations of each prompt (rows of one prompt adjacent) until
// every row has emitted params.stop_token or max_new_tokens columns exist. Runs without autograd.
// Each row draws from its own stream (sample_stream), so a row's tokens depend on the seed, its
// place in the whole batch and the weights, not on the other rows of the call. Throws
// std::invalid_argument when a prompt is empty or longer than part.prompt_width, an id is outside
// the vocabulary, part.prompt_index has another length than prompts or a negative index, or
// prompt + max_new_tokens exceeds the context.
// `keep`, when given, carries the decode cache from one call to the next (a rollout engine's):
// a cache it holds is reused when it is large enough (DecodeCache::reuse), and the cache this call
// decoded with is left in it. The tokens are the same either way.
Generation generate(const Model& policy, const std::vector<std::vector<std::int32_t>>& prompts,
                    std::int32_t samples_per_prompt, const SamplingParams& params, bool use_cache = true,
                    BatchPart part = {}, std::unique_ptr<DecodeCache>* keep = nullptr);

// The key of sample `sample` of prompt `prompt` (indices in the whole batch) of a request seeded
// `seed`; uniform(key, t) is its t-th draw, in (0, 1). SplitMix64 over the counters: no state.
std::uint64_t sample_stream(std::uint64_t seed, std::int64_t prompt, std::int64_t sample);
double uniform(std::uint64_t stream, std::int64_t t);

// One token per row from logits [N, V] (temperature 0: argmax; else softmax(logits / T), truncated
// to the top-p nucleus), by inverting the distribution's CDF at `uniforms` [N] f64 in (0, 1) (one
// per row; unused when greedy). `logprob` receives [N] f32: log softmax(logits / T)[token] over the
// full distribution (T = 1 when greedy).
at::Tensor sample_tokens(const at::Tensor& logits, const SamplingParams& params, const at::Tensor& uniforms,
                         at::Tensor* logprob);

}  // namespace troupe::actors
