// Model: what the trainer, the rollout engine, the reference and the reward model compute with. A
// model is named parameter tensors (so the same weights serve training, generation and safetensors
// files) and a forward pass giving next-token logits and named scalar heads ("value" of a critic,
// "score" of a reward model: PolicyConfig::scalar_heads). Architectures are registered by name and
// picked by PolicyConfig::architecture (key model.architecture): "transformer" (policy.hpp) is the
// library's; a program adds its own with TROUPE_MODEL at namespace scope, so that its worker
// processes (the same binary, which never runs main) have it too. Include only from torch-using
// sources (needs at::Tensor).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "troupe/actors/safetensors.hpp"
#include "troupe/actors/types.hpp"

namespace troupe::actors {

using NamedParameters = std::vector<std::pair<std::string, at::Tensor>>;

// What a model keeps between the steps of one incremental decode (the transformer's KV cache).
// Only the model that made it reads it.
class DecodeCache {
 public:
  virtual ~DecodeCache() = default;
  // Fills this cache's first `length` positions from `prefix` (a cache of the same model, already
  // filled that far), each of its rows repeated `repeats` times in a row: row r takes prefix row
  // r / repeats. A prompt's samples then share one prefill (generate()). Returns false, changing
  // nothing, when this cache cannot (the default); generate() then prefills every row itself.
  virtual bool repeat_rows(const DecodeCache& prefix, std::int64_t repeats, std::int64_t length);
  // Makes this cache one for `batch` rows and up to `max_len` positions in the memory it has, so
  // that a rollout engine's decodes, one after another, allocate (and fault in, and zero) no cache
  // of their own (generate()'s `keep`). What a position held before stays until a forward writes
  // it: a decode reads only the positions it has written. Returns false, changing nothing, when it
  // cannot (the default; too small): the caller makes a new one.
  virtual bool reuse(std::int64_t batch, std::int64_t max_len);
};

class Model {
 public:
  struct Outputs {
    at::Tensor logits;                           // [B, T, vocab] f32 (undefined when not asked for)
    std::map<std::string, at::Tensor> heads;     // [B, T] f32, one per config().scalar_heads
  };

  virtual ~Model() = default;

  // tokens, positions [B, Tq] i64 (positions_from_mask of a left-padded batch); key_mask
  // [B, offset + Tq] bool marks the keys that may be attended, causally. With a cache (this model's
  // make_cache), the call extends it: the cached positions before `offset` are not passed again;
  // without one, offset must be 0. Returns logits [B, Tq, vocab] f32, differentiable when the
  // parameters require grad.
  virtual at::Tensor forward(const at::Tensor& tokens, const at::Tensor& positions, const at::Tensor& key_mask,
                             DecodeCache* cache = nullptr, std::int64_t offset = 0) const = 0;
  // The same pass without a cache: the logits (unless `logits` is false) and every scalar head.
  virtual Outputs forward_outputs(const at::Tensor& tokens, const at::Tensor& positions, const at::Tensor& key_mask,
                                  bool logits = true) const = 0;
  // A cache for decoding `batch` rows up to `max_len` positions, or null (the default): the model
  // decodes without one, generate() passing it the whole prefix at each step.
  virtual std::unique_ptr<DecodeCache> make_cache(std::int64_t batch, std::int64_t max_len) const;

  const PolicyConfig& config() const { return config_; }
  const NamedParameters& parameters() const { return params_; }
  std::int64_t parameter_count() const;
  void set_requires_grad(bool on);
  // Copies `tensors` into the parameters. Every parameter must be present, once, with its exact
  // shape and dtype f32; extra names are an error too. Throws std::invalid_argument naming the
  // problem, and then has changed nothing.
  void load(const NamedTensors& tensors);
  // What load would refuse, with nothing changed (a checkpoint checked whole before it loads).
  void check(const NamedTensors& tensors) const;
  // Like load, but the parameters become the given tensors' memory (no copy); the caller must not
  // write that memory while this model uses it. For frozen or inference-only models.
  void adopt(const NamedTensors& tensors);
  // Copies the parameters `tensors` has by name (a reward model or critic started from an SFT
  // policy's trunk): every parameter but the scalar heads must be there, with its shape; names this
  // model lacks are skipped. Returns the scalar heads left as they were. Refused as load is,
  // changing nothing.
  std::vector<std::string> load_trunk(const NamedTensors& tensors);
  // Views of the parameters (sharing their memory).
  NamedTensors views() const;

 private:
  std::vector<at::Tensor> checked(const NamedTensors& tensors) const;   // load's checks, in parameter order

 protected:
  // Checks the scalar head names (distinct, non-empty, not "lm"); std::invalid_argument otherwise.
  explicit Model(PolicyConfig config);
  Model(const Model&) = default;
  Model& operator=(const Model&) = default;

  const at::Tensor& param(std::size_t i) const { return params_[i].second; }
  // Appends "<h>_head.weight" [1, width] and "<h>_head.bias" [1] for every scalar head, after the
  // model's own parameters (weights N(0, 1/sqrt(width + 1)), as OpenRLHF's value heads).
  void add_scalar_heads(std::int64_t width, at::Generator& gen);
  // Each scalar head of the final hidden states `h` [B, T, width], by name ([B, T]).
  std::map<std::string, at::Tensor> scalar_heads_of(const at::Tensor& h) const;

  PolicyConfig config_;
  NamedParameters params_;
  std::size_t first_head_ = 0;   // index of the first scalar head's weight (add_scalar_heads)
};

using ModelFactory = std::function<std::unique_ptr<Model>(const PolicyConfig&)>;
// Registration is thread-safe; a later one under the same name replaces the earlier.
void register_model(const std::string& name, ModelFactory factory);
// The model config.architecture names, with initial weights from config.seed. Throws
// std::invalid_argument for an unknown architecture (naming the known ones) and whatever the
// factory throws for a config it refuses.
std::unique_ptr<Model> make_model(const PolicyConfig& config);
std::vector<std::string> model_names();

}  // namespace troupe::actors

#define TROUPE_DETAIL_MODEL_CAT2(a, b) a##b
#define TROUPE_DETAIL_MODEL_CAT(a, b) TROUPE_DETAIL_MODEL_CAT2(a, b)
// Registers `Type` (a Model with a constructor from const PolicyConfig&) as architecture `name`,
// at static initialisation.
#define TROUPE_MODEL(name, Type)                                                                       \
  static const bool TROUPE_DETAIL_MODEL_CAT(troupe_model_, __COUNTER__) [[maybe_unused]] =              \
      (::troupe::actors::register_model(                                                                \
           name, [](const ::troupe::actors::PolicyConfig& c) -> std::unique_ptr<::troupe::actors::Model> { \
             return std::make_unique<Type>(c);                                                          \
           }),                                                                                          \
       true)
