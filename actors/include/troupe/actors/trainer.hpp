// Trainer actor: the policy being optimised, AdamW, gradient clipping and accumulation over
// micro-batches. The loss is an objective registered by name (objective.hpp), so one Trainer
// serves SFT and any RL algorithm. After each optimizer step the policy version goes up by one.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>
#include <string>

#include "troupe/actors/rollout_engine.hpp"   // kStoreVersionOffset
#include "troupe/actors/types.hpp"
#include "troupe/weight_store.hpp"

namespace troupe::actors {

struct TrainerConfig {
  PolicyConfig policy;
  OptimConfig optim;
  std::int32_t threads = 2;   // libtorch intra-op threads of this actor's thread
  std::int32_t blas_threads = 0;   // > 0: OpenBLAS's threads for this actor's whole process (blas.hpp); 0 leaves them
  MSGPACK_DEFINE(policy, optim, threads, blas_threads);
};

class Trainer {
 public:
  explicit Trainer(TrainerConfig config);   // initial weights from config.policy.seed, version 0
  ~Trainer();
  Trainer(Trainer&&) noexcept;

  // Forward + backward over batch.micro_batches parts, one clip, one AdamW step.
  TrainMetrics train_step(TrainBatch batch);
  // A snapshot of the current parameters (a copy that the trainer never writes), tagged with the
  // current version: safe to adopt without copying (RolloutEngine::update_weights).
  Weights weights();
  // Starts a fresh optimizer (moments and step count reset) with `config`.
  void set_optimizer(OptimConfig config);
  // Publishes the current parameters to `store` as store version policy_version() + 1 (store
  // versions start at 1; see kStoreVersionOffset), unless it already holds that version. One
  // copy into the store's buffer; returns the policy version published. Throws
  // std::invalid_argument when the store holds a newer version (a checkpoint was loaded since). It
  // asks the store its latest version unless its version is above its last publish there: a newer
  // version goes straight in (the store refuses one that is not above its latest, should another
  // publisher have gone past).
  std::int64_t publish_to(ActorRef<WeightStore> store);
  std::int64_t policy_version();

  // Checkpoint: <dir>/policy.safetensors and <dir>/optimizer.safetensors (version and optimizer
  // config in the metadata). Restoring gives bit-identical parameters, moments and step count.
  void save_checkpoint(std::string dir);
  std::int64_t load_checkpoint(std::string dir);   // returns the restored version
  void save_weights(std::string path);              // the policy alone, as safetensors
  // Starts the model from the trunk of the policy saved at `path` (Policy::load_trunk: a reward
  // model or critic from an SFT policy); the optimizer's state restarts. Returns the scalar heads
  // left at their initial weights.
  std::vector<std::string> load_trunk(std::string path);
  // The same, with the file's scalar head `file_head` as this model's head `head` (a critic
  // started from a reward model: its score head as the value head, as OpenRLHF does); an empty
  // file_head is load_trunk. Throws std::invalid_argument when the file lacks `file_head`.
  std::vector<std::string> load_trunk_as(std::string path, std::string file_head, std::string head);
  // The scalar head `head` over `batch`, token-aligned (token_values_of): [N, T] f32, no gradients
  // (a critic's values for GAE). Throws std::invalid_argument for a head the model lacks.
  TensorView head_values(SequenceBatch batch, std::string head);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace troupe::actors

TROUPE_ACTOR(troupe::actors::Trainer, train_step, weights, set_optimizer, publish_to, policy_version,
             save_checkpoint, load_checkpoint, save_weights, load_trunk, load_trunk_as, head_values);
