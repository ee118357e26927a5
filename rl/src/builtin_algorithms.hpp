// The library's algorithms, one file each (grpo.cpp, ppo.cpp, dpo.cpp). run.cpp's registry names
// their factories, so that the linker keeps their object files in every program that links rl.
#pragma once

#include <memory>

#include "troupe/rl/run.hpp"

namespace troupe::rl::detail {

std::unique_ptr<Algorithm> make_grpo(const RunConfig& config);
std::unique_ptr<Algorithm> make_ppo(const RunConfig& config);
std::unique_ptr<Algorithm> make_dpo(const RunConfig& config);

}  // namespace troupe::rl::detail
