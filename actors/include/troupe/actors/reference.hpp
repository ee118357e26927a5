// Reference actor: a frozen policy (typically the SFT warm start) that scores sequences for the
// KL term of the RL loss.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "troupe/actors/types.hpp"

namespace troupe::actors {

struct ReferenceConfig {
  PolicyConfig policy;
  std::string weights_path;   // safetensors; empty keeps the initial weights of policy.seed
  std::int32_t threads = 2;
  std::int32_t blas_threads = 0;   // > 0: OpenBLAS's threads for this actor's whole process (blas.hpp); 0 leaves them
  MSGPACK_DEFINE(policy, weights_path, threads, blas_threads);
};

class Reference {
 public:
  explicit Reference(ReferenceConfig config);   // throws SafetensorsError for a bad weights file
  ~Reference();
  Reference(Reference&&) noexcept;

  // [N, T] f32 per-token logprobs (layout in types.hpp) under the frozen policy.
  TensorView logprobs(LogprobRequest request);
  void load_weights(std::string path);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace troupe::actors

TROUPE_ACTOR(troupe::actors::Reference, logprobs, load_weights);
