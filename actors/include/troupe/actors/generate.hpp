// Batched autoregressive sampling from a Policy, with or without a KV cache (the two give the same
// tokens: the cache only saves recomputation). Include only from torch-using sources.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
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
  std::vector<std::vector<std::int32_t>> responses;   // stop token excluded
  std::vector<std::uint8_t> finished;
  std::int32_t prompt_len = 0;
  std::int64_t generated_tokens = 0;
};

// Samples `samples_per_prompt` continuations of each prompt (rows of one prompt adjacent) until
// every row has emitted params.stop_token or max_new_tokens columns exist. Runs without autograd.
// Deterministic for a given params.seed. Throws std::invalid_argument when a prompt is empty, an
// id is outside the vocabulary, or prompt + max_new_tokens exceeds the context.
Generation generate(const Policy& policy, const std::vector<std::vector<std::int32_t>>& prompts,
                    std::int32_t samples_per_prompt, const SamplingParams& params, bool use_cache = true);

// One token per row from logits [N, V] (temperature 0: argmax; else softmax(logits / T), truncated
// to the top-p nucleus). `logprob` receives [N] f32: log softmax(logits / T)[token] over the full
// distribution (T = 1 when greedy).
at::Tensor sample_tokens(const at::Tensor& logits, const SamplingParams& params, at::Generator& gen,
                         at::Tensor* logprob);

}  // namespace troupe::actors
