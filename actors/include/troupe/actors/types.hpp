// The messages the RL roles exchange: plain msgpack structs, tensors as troupe::TensorView
// (in-process they pass without a copy). No torch here, so a driver that only calls actors stays
// cheap to compile.
//
// Token layout shared by every role: a batch of N sequences is [N, T]; prompts are left-padded to
// the longest prompt P, responses follow from column P and are right-padded. `attn_mask` marks
// real tokens. Per-token values at column t describe token t given tokens < t, so column 0 is 0.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <iterator>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "troupe/troupe.hpp"

namespace troupe::actors {

// A small causal transformer (GPT-2 style, pre-LayerNorm, learned positions).
struct PolicyConfig {
  std::int32_t vocab_size = 16;
  std::int32_t context = 32;    // longest sequence (prompt + response) the model accepts
  std::int32_t layers = 2;
  std::int32_t d_model = 64;
  std::int32_t heads = 4;       // must divide d_model
  std::int32_t d_ff = 0;        // 0: 4 * d_model
  std::uint64_t seed = 0;       // initial weights
  // Named scalar heads on the final hidden state, e.g. "score" (a reward model) or "value" (a
  // critic): one number per position, parameters "<name>_head.weight" [1, d_model] and ".bias" [1].
  std::vector<std::string> scalar_heads;
  // The model's architecture, by name (model.hpp): "transformer" (the fields above), or one the
  // program registers with TROUPE_MODEL, which reads the fields it needs.
  std::string architecture = "transformer";
  MSGPACK_DEFINE(vocab_size, context, layers, d_model, heads, d_ff, seed, scalar_heads, architecture);
};

// Rows of token ids, each its own length, in one buffer (a batch's responses): row i is
// values()[offsets()[i], offsets()[i + 1]). A batch of any number of rows is two allocations, where
// a vector per row made one per row, and again in each process that decoded it. Rows read as spans.
class TokenRows {
 public:
  TokenRows() = default;
  TokenRows(std::initializer_list<std::vector<std::int32_t>> rows);
  explicit TokenRows(const std::vector<std::vector<std::int32_t>>& rows);

  std::size_t size() const { return offsets_.size() - 1; }
  bool empty() const { return size() == 0; }
  std::span<const std::int32_t> operator[](std::size_t i) const {   // i < size()
    return {values_.data() + offsets_[i], values_.data() + offsets_[i + 1]};
  }
  std::span<const std::int32_t> at(std::size_t i) const;   // throws std::out_of_range
  void push_back(std::span<const std::int32_t> row);
  void reserve(std::size_t rows, std::size_t values);
  std::vector<std::vector<std::int32_t>> to_vectors() const;
  const std::vector<std::int32_t>& values() const { return values_; }
  const std::vector<std::int64_t>& offsets() const { return offsets_; }
  bool operator==(const TokenRows&) const = default;

  class const_iterator {   // the rows in order, as spans (by value: an input iterator to the old rules)
   public:
    using iterator_concept = std::forward_iterator_tag;
    using iterator_category = std::input_iterator_tag;
    using value_type = std::span<const std::int32_t>;
    using difference_type = std::ptrdiff_t;
    using pointer = void;
    using reference = value_type;
    const_iterator() = default;
    const_iterator(const TokenRows* rows, std::size_t i) : rows_(rows), i_(i) {}
    value_type operator*() const { return (*rows_)[i_]; }
    const_iterator& operator++() { ++i_; return *this; }
    const_iterator operator++(int) { auto t = *this; ++i_; return t; }
    bool operator==(const const_iterator& o) const { return i_ == o.i_; }

   private:
    const TokenRows* rows_ = nullptr;
    std::size_t i_ = 0;
  };
  const_iterator begin() const { return {this, 0}; }
  const_iterator end() const { return {this, size()}; }

  // msgpack: [values, offsets]. Decoding checks the offsets (from 0, never decreasing, ending at
  // the values' count): a peer's bad bytes are a decode error, not a row read out of bounds.
  template <class Packer>
  void msgpack_pack(Packer& pk) const {
    pk.pack_array(2);
    pk.pack(values_);
    pk.pack(offsets_);
  }
  void msgpack_unpack(const msgpack::object& o);

 private:
  std::vector<std::int32_t> values_;
  std::vector<std::int64_t> offsets_{0};
};

struct SamplingParams {
  float temperature = 1.0f;        // 0: greedy
  float top_p = 1.0f;              // nucleus sampling; 1 keeps the whole distribution
  std::int32_t max_new_tokens = 8;
  std::int32_t stop_token = -1;    // generation of a row ends after it emits this id; -1: none
  // The stream the request's samples draw from: the sample (prompt p, sample s) uses its own
  // counter-based stream keyed by (seed, first_prompt + p, s), so a sample does not depend on which
  // other prompts share its request (or engine).
  std::uint64_t seed = 0;
  MSGPACK_DEFINE(temperature, top_p, max_new_tokens, stop_token, seed);
};

struct GenerateRequest {
  std::vector<std::vector<std::int32_t>> prompts;
  std::int32_t samples_per_prompt = 1;   // the G of GRPO; the samples of one prompt are adjacent rows
  SamplingParams sampling;
  // For a part of a larger batch split across engines: each prompt's index in the whole batch (it
  // keys the prompt's samples' streams; empty: 0, 1, ...), and the whole batch's longest prompt
  // (prompts are left-padded to it; 0: this request's longest). With both, each row's tokens are
  // those the whole batch would give it on one engine.
  std::vector<std::int64_t> prompt_index;
  std::int32_t prompt_width = 0;
  MSGPACK_DEFINE(prompts, samples_per_prompt, sampling, prompt_index, prompt_width);
};

// N = prompts * samples_per_prompt rows.
struct RolloutBatch {
  TensorView tokens;          // [N, T] i64, T = prompt_len + generated columns
  TensorView attn_mask;       // [N, T] bool
  TensorView response_mask;   // [N, T] bool: generated tokens, the stop token included
  TensorView logprobs;        // [N, T] f32: log pi(token | prefix) at the sampling temperature (1 if greedy),
                              //   over the full (not top-p truncated) distribution; 0 off the response
  TokenRows responses;                                // generated ids per row, stop token excluded
  std::vector<std::uint8_t> finished;                 // 1 if the row emitted the stop token
  std::vector<std::int64_t> policy_version;           // per row (RL-1)
  std::int32_t prompt_len = 0;                        // P
  std::int64_t generated_tokens = 0;                  // response tokens, stop tokens included
  double seconds = 0;
  MSGPACK_DEFINE(tokens, attn_mask, response_mask, logprobs, responses, finished, policy_version,
                 prompt_len, generated_tokens, seconds);
};

// One optimizer step's worth of data for the Trainer.
struct TrainBatch {
  std::string objective = "sft";                 // a name registered with register_objective
  TensorView tokens;                             // [N, T] i64
  TensorView attn_mask;                          // [N, T] bool
  TensorView loss_mask;                          // [N, T] bool: tokens whose logprob enters the loss
  std::map<std::string, TensorView> inputs;      // objective-specific, first dimension N
  std::map<std::string, double> options;         // objective hyper-parameters
  float temperature = 1.0f;                      // logits are divided by it before the softmax
  std::int32_t micro_batches = 1;                // gradient accumulation: rows split in this many parts (at most)
  // Rows travel in groups of this many that no micro-batch splits: a preference pair (2), a GRPO
  // group (G). N must be a multiple of it; a part then holds a whole number of groups.
  std::int32_t row_group = 1;
  // The rows the loss averages over; 0: N. More than N when rows that carry no gradient were left
  // out of the batch (rl::grpo_batch: zero-advantage groups): each part's loss is weighted by its
  // rows over loss_rows, so the gradient is the whole batch's.
  std::int64_t loss_rows = 0;
  MSGPACK_DEFINE(objective, tokens, attn_mask, loss_mask, inputs, options, temperature, micro_batches, row_group,
                 loss_rows);
};

struct TrainMetrics {
  std::int64_t policy_version = 0;               // after this step
  double loss = 0;
  double grad_norm = 0;                          // before clipping
  double entropy = 0;                            // mean over loss-mask tokens
  double lr = 0;
  std::map<std::string, double> values;          // the objective's metrics
  std::int64_t tokens = 0;                       // loss-mask tokens
  double seconds = 0;
  MSGPACK_DEFINE(policy_version, loss, grad_norm, entropy, lr, values, tokens, seconds);
};

struct OptimConfig {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.99;
  double eps = 1e-8;
  double weight_decay = 0.0;     // decoupled (AdamW, Loshchilov & Hutter 2019)
  double max_grad_norm = 1.0;    // global L2 norm; <= 0 disables clipping
  std::int32_t warmup_steps = 0; // linear warm-up of the learning rate
  MSGPACK_DEFINE(lr, beta1, beta2, eps, weight_decay, max_grad_norm, warmup_steps);
};

// A policy's weights at one version: names as in Policy::named_parameters().
struct Weights {
  std::int64_t version = 0;
  std::vector<std::string> names;
  std::vector<TensorView> tensors;
  MSGPACK_DEFINE(version, names, tensors);
};

// Whole sequences to score (RewardModel::score).
struct SequenceBatch {
  TensorView tokens;       // [N, T] i64
  TensorView attn_mask;    // [N, T] bool
  MSGPACK_DEFINE(tokens, attn_mask);
};

struct LogprobRequest {
  TensorView tokens;       // [N, T] i64
  TensorView attn_mask;    // [N, T] bool
  float temperature = 1.0f;
  MSGPACK_DEFINE(tokens, attn_mask, temperature);
};

struct ScoreItem {
  std::string response;       // decoded, stop token excluded
  std::string ground_truth;
  bool finished = false;      // the stop token was emitted
  MSGPACK_DEFINE(response, ground_truth, finished);
};

struct RewardResult {
  float reward = 0;
  bool format_ok = false;     // the response has the shape an answer must have
  bool correct = false;
  MSGPACK_DEFINE(reward, format_ok, correct);
};

}  // namespace troupe::actors
