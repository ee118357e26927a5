// The policy model: a small causal transformer (GPT-2 layout: pre-LayerNorm blocks, GELU MLP,
// learned positions, untied output head) written as plain ATen ops over named parameter tensors,
// so the same weights serve training (autograd), generation (KV cache) and safetensors files.
// Include only from torch-using sources (needs at::Tensor).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "troupe/actors/model.hpp"
#include "troupe/actors/safetensors.hpp"
#include "troupe/actors/types.hpp"

namespace troupe::actors {

// Keys and values of every layer for `batch` rows and up to `max_len` positions.
class KvCache final : public DecodeCache {
 public:
  KvCache(const PolicyConfig& config, std::int64_t batch, std::int64_t max_len);
  at::Tensor& keys(std::size_t layer) { return keys_[layer]; }       // [B, H, max_len, Dh]
  at::Tensor& values(std::size_t layer) { return values_[layer]; }   // [B, H, max_len, Dh]
  std::int64_t max_len() const { return max_len_; }
  // Throws std::invalid_argument when prefix is a KvCache of other sizes (rows * repeats, heads,
  // layers) or too short; false when it is not a KvCache.
  bool repeat_rows(const DecodeCache& prefix, std::int64_t repeats, std::int64_t length) override;
  // True when batch * max_len positions fit in the memory the cache was made with.
  bool reuse(std::int64_t batch, std::int64_t max_len) override;

 private:
  void view(std::int64_t batch, std::int64_t max_len);   // keys_, values_ over the first elements of the memory

  std::int64_t heads_, head_dim_;
  std::vector<at::Tensor> key_memory_, value_memory_;   // per layer, flat
  std::vector<at::Tensor> keys_, values_;
  std::int64_t max_len_;
};

// The library's architecture, "transformer".
class Policy final : public Model {
 public:
  // Random initial weights from config.seed (N(0, 0.02); residual projections / sqrt(2 layers)).
  // Throws std::invalid_argument for an inconsistent config.
  explicit Policy(const PolicyConfig& config);

  // Query i attends key j when key_mask[b, j] and j <= offset + i (and always itself, so a padding
  // query stays finite). With a cache (a KvCache), this call's keys/values are written at
  // [offset, offset + Tq) and the cached ones before `offset` are read.
  at::Tensor forward(const at::Tensor& tokens, const at::Tensor& positions, const at::Tensor& key_mask,
                     DecodeCache* cache = nullptr, std::int64_t offset = 0) const override;
  Outputs forward_outputs(const at::Tensor& tokens, const at::Tensor& positions, const at::Tensor& key_mask,
                          bool logits = true) const override;
  std::unique_ptr<DecodeCache> make_cache(std::int64_t batch, std::int64_t max_len) const override;

 private:
  at::Tensor block(const at::Tensor& x, std::size_t layer, const at::Tensor& key_mask, KvCache* cache,
                   std::int64_t offset) const;
  at::Tensor hidden(const at::Tensor& tokens, const at::Tensor& positions, const at::Tensor& key_mask, KvCache* cache,
                    std::int64_t offset) const;   // after the final LayerNorm, [B, Tq, d]
  std::size_t lm_head() const;                    // index of head.weight; the scalar heads follow
};

// Positions of real tokens in a left-padded batch: cumsum(attn_mask) - 1, clamped at 0. [N, T] i64.
at::Tensor positions_from_mask(const at::Tensor& attn_mask);

// Per-token logprobs of a whole batch: out[n, t] = log softmax(logits[n, t-1] / temperature)[tokens[n, t]]
// for t >= 1, out[n, 0] = 0. tokens [N, T] i64, attn_mask [N, T] bool -> [N, T] f32, differentiable
// when the policy's parameters require grad. If `entropy` is given it receives the entropy of the
// same distributions ([N, T], no grad).
at::Tensor token_logprobs(const Model& model, const at::Tensor& tokens, const at::Tensor& attn_mask,
                          float temperature, at::Tensor* entropy = nullptr);
// The same from the logits [N, T, V] of tokens (Policy::forward_outputs).
at::Tensor token_logprobs_of(const at::Tensor& logits, const at::Tensor& tokens, float temperature,
                             at::Tensor* entropy = nullptr);

// A scalar head [N, T] (a value per hidden position) aligned to token columns as types.hpp lays
// out per-token values: out[:, t] = head[:, t - 1], the value of the state before token t (column 0: 0).
at::Tensor token_values_of(const at::Tensor& head);

// The column of each row's last real token in the layout of types.hpp (the highest set column of
// attn_mask; 0 for an empty row). [N] i64.
at::Tensor last_token_index(const at::Tensor& attn_mask);

// Sets this thread's libtorch intra-op threads and the kernels' thread budget. Actors call it from
// their constructor, which runs on the actor's own thread (OpenMP thread counts are per thread).
// blas_threads > 0 also sets the BLAS's own pool, which is process-wide (blas.hpp).
void set_compute_threads(int n, int blas_threads = 0);

// What a compute method needs of the thread that runs it, for its duration: `threads` libtorch
// intra-op (OpenMP) threads and autograd as a fresh thread has it (on, no inference mode). The
// actor's own thread has them from its constructor; a caller's thread running the call
// (ActorRef::call_sync) has its own, which are restored when the scope ends.
class ComputeScope {
 public:
  explicit ComputeScope(int threads);
  ~ComputeScope();
  ComputeScope(const ComputeScope&) = delete;
  ComputeScope& operator=(const ComputeScope&) = delete;

 private:
  int threads_before_ = 0;   // > 0: changed, and restored at the end
  c10::AutoGradMode grad_{true};
  std::optional<c10::InferenceMode> no_inference_;
};

}  // namespace troupe::actors
