// RewardModel actor: a learned reward (the transformer with a "score" head, trained with the
// Bradley-Terry loss by build/bin/reward_model) that scores whole sequences, batched: the score of
// a sequence is the head's value at its last real token.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "troupe/actors/types.hpp"

namespace troupe::actors {

struct RewardModelConfig {
  PolicyConfig model;          // its scalar_heads must include "score"
  std::string weights_path;    // safetensors (every parameter); empty keeps the initial weights
  std::int32_t threads = 1;
  std::int32_t blas_threads = 0;   // > 0: OpenBLAS's threads for this actor's whole process (blas.hpp); 0 leaves them
  MSGPACK_DEFINE(model, weights_path, threads, blas_threads);
};

class RewardModel {
 public:
  // Throws std::invalid_argument when the model has no "score" head, SafetensorsError for a bad file.
  explicit RewardModel(RewardModelConfig config);
  ~RewardModel();
  RewardModel(RewardModel&&) noexcept;

  // One score per row of sequences laid out as types.hpp says (prompt left-padded, response
  // right-padded): the "score" head at the row's last real token. No gradients.
  std::vector<float> score(SequenceBatch batch);
  void load_weights(std::string path);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace troupe::actors

TROUPE_ACTOR(troupe::actors::RewardModel, score, load_weights);
