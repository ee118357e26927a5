// Checkpoints of a run: <run_dir>/checkpoints/step-NNNNNN/ holds the Trainer's policy and optimizer
// (safetensors) and state.json with everything else the next step depends on: the step, the data
// cursor and the run seed (each step's sampling seed derives from seed and step, so no RNG stream
// needs saving), and the algorithm's own part (PPO's critic; DPO's unfinished round). A checkpoint
// directory appears atomically (written aside, then renamed).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "troupe/rl/task.hpp"

namespace troupe::rl {

struct RunState {
  std::int64_t step = 0;             // steps completed
  std::int64_t policy_version = 0;
  std::uint64_t seed = 0;
  DataCursor cursor;
  std::string data;   // what the cursor walks (Run: the task spec, the sets' sizes, the run seed); "" in older checkpoints
  double sft_heldout_acc = 0;
  double sft_heldout_format = 0;
  std::map<std::string, double> sft_heldout_acc_by_kind;
  std::int64_t sft_steps = 0;          // warm-start steps taken (more than algo.sft_steps when it trained on to sft_target_nll, fewer at sft_stop_nll)
  std::map<std::string, double> values;   // an algorithm's scalars (PPO's adaptive KL coefficient)
};

std::string checkpoint_dir(const std::string& run_dir, std::int64_t step);
// The newest complete checkpoint under run_dir, if any.
std::optional<std::string> latest_checkpoint(const std::string& run_dir);

void save_run_state(const std::string& dir, const RunState& state);
RunState load_run_state(const std::string& dir);   // throws std::runtime_error on a missing or bad file

// Atomic publication: moves `staging` to `final_dir` (replacing an older one of the same name).
void publish_checkpoint(const std::string& staging, const std::string& final_dir);

}  // namespace troupe::rl
