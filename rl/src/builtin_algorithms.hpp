// The library's algorithms, one file each (grpo.cpp, ppo.cpp, dpo.cpp). run.cpp's registry names
// their factories, so that the linker keeps their object files in every program that links rl.
#pragma once

#include <memory>

#include "troupe/rl/run.hpp"

namespace troupe::rl::detail {

std::unique_ptr<Algorithm> make_grpo(const RunConfig& config);
std::unique_ptr<Algorithm> make_ppo(const RunConfig& config);
std::unique_ptr<Algorithm> make_dpo(const RunConfig& config);

// Whether the objective registered as `name` is grpo_objective itself (under any name), whose
// loss a row with advantage 0 leaves unchanged when kl_coef is 0: grpo_batch may then leave such
// groups out. False for any other function, a program's replacement registered as "grpo" too,
// and for a name not registered.
bool is_grpo_objective(const std::string& name);
// Whether an objective of that name is registered (in this process: a program's registrations are
// static, so its workers have the same).
bool objective_registered(const std::string& name);

}  // namespace troupe::rl::detail
