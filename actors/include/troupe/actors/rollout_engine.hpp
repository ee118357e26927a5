// RolloutEngine actor: batched sampling from its own copy of the policy. Weights change only
// between batches (update_weights), and every row of a batch carries the version that produced it
// (RL-1).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "troupe/actors/types.hpp"
#include "troupe/weight_store.hpp"

namespace troupe::actors {

// A policy version v is published to a WeightStore as store version v + 1 (store versions start at 1).
inline constexpr std::int64_t kStoreVersionOffset = 1;

struct RolloutConfig {
  PolicyConfig policy;
  std::int32_t threads = 2;    // libtorch intra-op threads of this actor's thread
  bool use_cache = true;       // KV cache; false recomputes the prefix each token (for tests)
  std::int32_t blas_threads = 0;   // > 0: OpenBLAS's threads for this actor's whole process (blas.hpp); 0 leaves them
  MSGPACK_DEFINE(policy, threads, use_cache, blas_threads);
};

class RolloutEngine {
 public:
  explicit RolloutEngine(RolloutConfig config);   // initial weights from config.policy.seed, version 0
  ~RolloutEngine();
  RolloutEngine(RolloutEngine&&) noexcept;

  // Samples request.samples_per_prompt responses per prompt (see generate.hpp for the layout).
  RolloutBatch generate(GenerateRequest request);
  // Serves `weights` from the next batch on. The engine adopts the tensors' storage (a pointer
  // swap, no copy): the publisher must not write them afterwards (Trainer::weights() hands out a
  // snapshot for this reason). Throws on a missing or misshapen tensor. Returns the new version.
  std::int64_t update_weights(Weights weights);
  // Pulls the latest version from `store` (WeightSubscriber: a reference in one process, a
  // read-only mapping on one host, a checked copy across hosts) and serves it from the next batch
  // on. Returns the policy version it now serves (store version - kStoreVersionOffset).
  std::int64_t pull_weights(ActorRef<WeightStore> store);
  std::int64_t policy_version();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// One engine's part of a batch split across engines: its prompts' rows in the whole batch (0 to
// prompts - 1, the order of the part's request) and what it sampled for them.
struct RolloutPart {
  std::vector<std::int64_t> prompt_index;
  RolloutBatch batch;
};

// The whole batch from its parts: the row of sample s of prompt p at p * samples + s, the columns
// padded to the widest part (tokens 0, masks false, logprobs 0), generated_tokens summed, seconds
// the slowest part's. With parts sampled as GenerateRequest describes (prompt_index, one
// prompt_width), this is the batch one engine gives for the whole request. Throws
// std::invalid_argument when the parts do not cover each prompt exactly once or disagree on the
// prompt width.
RolloutBatch merge_rollouts(const std::vector<RolloutPart>& parts, std::int32_t samples);

}  // namespace troupe::actors

TROUPE_ACTOR(troupe::actors::RolloutEngine, generate, update_weights, pull_weights, policy_version);
