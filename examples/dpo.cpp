// examples/dpo: online DPO (Rafailov et al. 2023, arXiv:2305.18290) on the demo task: after the
// same SFT warm start, each step samples G answers per prompt from the current policy, pairs a
// correct one against a wrong one per prompt, and takes a DPO step against the frozen SFT policy
// (IPO with --set algo.dpo_ipo=true). Prints the same JSON line as build/bin/grpo.
#include <troupe/rl.hpp>

#include <iostream>
#include <string>

int main(int argc, char** argv) {
  auto rt = troupe::init(argc, argv);
  auto config = troupe::rl::RunConfig::demo();   // the demo's task, model, SFT and sampling
  config.algo.name = "dpo";
  config.algo.dpo_beta = 0.1;
  config.algo.steps = 450;   // its own length: 450 online rounds (README: the programs' table)
  config.run.run_dir = "runs/dpo";
  try {   // --config FILE, any key with --set algo.steps=200, the common keys' flags (--seed 2, --steps, ...)
    auto schema = troupe::rl::run_config_schema(config);
    if (!troupe::rl::parse_program_command_line("dpo", schema, argc, argv, troupe::rl::common_program_flags())) return 0;   // --help, --print-config
  } catch (const std::invalid_argument& e) {
    std::cerr << "dpo: " << e.what() << "\n";
    return 2;
  }
  return troupe::rl::run_and_report("dpo", rt, config);
}
