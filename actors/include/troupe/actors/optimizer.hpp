// AdamW (Loshchilov & Hutter 2019, arXiv:1711.05101) over named parameters, with global-norm
// gradient clipping and linear warm-up. Its whole state is named tensors, so a checkpoint is one
// safetensors file. Include only from torch-using sources.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>

#include "troupe/actors/policy.hpp"
#include "troupe/actors/types.hpp"

namespace troupe::actors {

class AdamW {
 public:
  AdamW(const NamedParameters& params, const OptimConfig& config);

  // Clips the gradients to config.max_grad_norm (global L2) and returns their norm before clipping.
  double clip_gradients();
  // One update with each parameter's .grad() (a parameter without a gradient is skipped), then
  // zeroes the gradients. Returns the learning rate used.
  double step();
  void zero_grad();

  std::int64_t steps() const { return steps_; }
  const OptimConfig& config() const { return config_; }

  // "exp_avg.<name>", "exp_avg_sq.<name>" views; metadata "steps".
  NamedTensors state_views() const;
  std::map<std::string, std::string> state_metadata() const;
  // Restores what state_views/state_metadata saved. Throws std::invalid_argument (or
  // SafetensorsError for a missing or misshapen tensor) on a mismatch, and then has changed nothing.
  void load_state(const SafetensorsFile& file);
  // What load_state would refuse, with nothing changed.
  void check_state(const SafetensorsFile& file) const;

 private:
  struct LoadedState {
    std::int64_t steps = 0;
    std::vector<at::Tensor> exp_avg, exp_avg_sq;
  };
  LoadedState checked_state(const SafetensorsFile& file) const;
  double current_lr() const;

  NamedParameters params_;
  std::vector<at::Tensor> exp_avg_, exp_avg_sq_;
  OptimConfig config_;
  std::int64_t steps_ = 0;
};

}  // namespace troupe::actors
