// The reward role of a run: what a step's samples are rewarded with. A backend is picked by
// RunConfig::algo.reward (key algo.reward), "<name>" or "<name>:<argument>":
//   "rule"        the task's verifier: 1 for a correct answer, 0 otherwise (the default);
//   "model:PATH"  a RewardModel actor (build/bin/reward_model's safetensors, the run's architecture
//                 with a score head) scores every sample, batched: RLHF with a learned reward.
// A program adds its own with TROUPE_REWARD_BACKEND (at namespace scope). Whatever the backend, the
// task's verifier still judges every sample's format and correctness, and the held-out accuracy,
// so a run reports what its policy really does even when the reward it trains on is hackable.
//
//   struct LengthPenalty : troupe::rl::RewardBackend {
//     std::vector<float> rewards(const troupe::rl::RewardInput& in) override {
//       std::vector<float> r;
//       for (std::size_t i = 0; i < in.verdicts.size(); ++i)
//         r.push_back(in.verdicts[i].reward - 0.01f * float(in.samples.responses[i].size()));
//       return r;
//     }
//   };
//   TROUPE_REWARD_BACKEND("length_penalty", [](troupe::rl::Run&, const std::string&) {
//     return std::make_unique<LengthPenalty>();
//   });
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "troupe/actors/reward.hpp"
#include "troupe/actors/types.hpp"
#include "troupe/rl/task.hpp"

namespace troupe::rl {

class Run;

// One step's samples, as Run::score receives them: row r answers problems[r / group_size].
struct RewardInput {
  const std::vector<Problem>& problems;
  const actors::RolloutBatch& samples;
  std::int32_t group_size;
  const std::vector<actors::RewardResult>& verdicts;   // the verifier's, one per row
};

class RewardBackend {
 public:
  virtual ~RewardBackend() = default;
  // One reward per sample row. Run::score refuses a count other than the rows'.
  virtual std::vector<float> rewards(const RewardInput& in) = 0;
  // Kills the backend's actors: the run calls it before it kills its own (also when the run fails
  // to start after making its backend).
  virtual void stop(Run& run);
};

// Makes a backend for `run` (which has made its task, tokenizer and data, and spawned none of its
// actors yet: a backend spawns its own with run.role_options). `argument` is what follows the
// name's ':' ("" without one). Throws std::invalid_argument for an argument it refuses.
using RewardBackendFactory = std::function<std::unique_ptr<RewardBackend>(Run& run, const std::string& argument)>;
// Registration is thread-safe; a later one under the same name replaces the earlier.
void register_reward_backend(const std::string& name, RewardBackendFactory factory);
// Splits `spec` at its first ':' and makes that backend. Throws std::invalid_argument for an unknown
// name (listing the known ones) and whatever the factory throws.
std::unique_ptr<RewardBackend> make_reward_backend(Run& run, const std::string& spec);
std::vector<std::string> reward_backend_names();

}  // namespace troupe::rl

#define TROUPE_DETAIL_RWD_CAT2(a, b) a##b
#define TROUPE_DETAIL_RWD_CAT(a, b) TROUPE_DETAIL_RWD_CAT2(a, b)
// Registers `factory` (a RewardBackendFactory) as `name` at static initialisation.
#define TROUPE_REWARD_BACKEND(name, factory)                                                          \
  static const bool TROUPE_DETAIL_RWD_CAT(troupe_reward_backend_, __COUNTER__) [[maybe_unused]] =       \
      (::troupe::rl::register_reward_backend(name, factory), true)
