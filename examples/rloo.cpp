// examples/rloo: RLOO (Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE Style
// Optimization for Learning from Human Feedback in LLMs", arXiv:2402.14740) written as a user of
// troupe writes an algorithm: public headers only, its own advantage estimator defined and
// registered here, the library's driver (rollout, scoring, reference, update, weight sync,
// metrics, checkpoints) doing the rest. Prints the same JSON line as build/bin/grpo.
#include <troupe/rl.hpp>

#include <iostream>
#include <string>

namespace {

// Each sample's baseline is the mean reward of the other k - 1 samples of its prompt (eq. 7):
//   A_i = r_i - (1 / (k - 1)) * sum_{j != i} r_j.
// No division by the group's std (unlike GRPO): the estimate stays unbiased.
troupe::rl::AdvantageOutput leave_one_out(const troupe::rl::AdvantageInput& in) {
  const auto k = std::size_t(in.group_size);
  troupe::rl::AdvantageOutput out;
  out.advantages.resize(in.rewards.size());
  for (std::size_t g = 0; g + k <= in.rewards.size(); g += k) {
    double sum = 0;
    for (std::size_t i = 0; i < k; ++i) sum += in.rewards[g + i];
    for (std::size_t i = 0; i < k; ++i) {
      const double r = in.rewards[g + i];
      out.advantages[g + i] = k > 1 ? float(r - (sum - r) / double(k - 1)) : 0.0f;
    }
  }
  return out;
}
// At namespace scope, so that worker processes (which never run main) have it too.
TROUPE_ADVANTAGE_ESTIMATOR("leave_one_out", leave_one_out);

}  // namespace

int main(int argc, char** argv) {
  auto rt = troupe::init(argc, argv);
  auto config = troupe::rl::RunConfig::demo();   // the demo's task, model, SFT and batch shape
  config.algo.advantage = "leave_one_out";
  config.run.run_dir = "runs/rloo";
  try {   // --config FILE, any key with --set algo.steps=200, the common keys' flags (--seed 2, --steps, ...)
    auto schema = troupe::rl::run_config_schema(config);
    if (!troupe::rl::parse_program_command_line("rloo", schema, argc, argv, troupe::rl::common_program_flags())) return 0;   // --help, --print-config
  } catch (const std::invalid_argument& e) {
    std::cerr << "rloo: " << e.what() << "\n";
    return 2;
  }
  return troupe::rl::run_and_report("rloo", rt, config);
}
