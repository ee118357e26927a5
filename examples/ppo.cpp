// examples/ppo: PPO (Schulman et al. 2017; Ouyang et al. 2022's recipe) on the demo task: after a
// 300-step SFT warm start (half the GRPO demo's: PPO climbs from a lower start), a critic (the
// policy's architecture with a value head, from the SFT trunk) gives per-token values; each step's
// rewards (the verifier's at the last token, a per-token KL penalty to the SFT policy) become GAE
// advantages and returns; the policy and the critic then take updates_per_batch epochs of
// mini_batches steps each, side by side. Prints the same JSON line as build/bin/grpo. With
// --reward model:PATH a RewardModel (build/bin/reward_model) gives the rewards.
#include <troupe/rl.hpp>

#include <iostream>
#include <string>

int main(int argc, char** argv) {
  auto rt = troupe::init(argc, argv);
  auto config = troupe::rl::RunConfig::demo();   // the demo's task, model and sampling
  config.algo.name = "ppo";
  config.algo.sft.steps = 300;         // from the demo's 600-step start (~50-70 %) PPO gained +12 in 450 steps; from 300 (~30 %), +24
  config.algo.sft.target_nll = 0;      // 300 steps on every seed (the demo's loss floor would train on past them)
  config.algo.sft.stop_nll = 0;
  config.algo.steps = 500;
  config.algo.kl_coef = 0.02;          // in the rewards, per token
  config.algo.updates_per_batch = 2;   // PPO epochs
  config.algo.mini_batches = 2;
  config.algo.optim.lr = 5e-4;
  config.algo.critic_optim.lr = 1e-3;
  config.algo.critic_optim.warmup_steps = 20;
  config.placement.blas_threads = 1;        // the policy and the critic train side by side (actors/blas.hpp)
  config.run.run_dir = "runs/ppo";
  try {   // --config FILE, any key with --set algo.steps=200, the common keys' flags (--seed 2, --steps, ...)
    auto schema = troupe::rl::run_config_schema(config);
    auto flags = troupe::rl::common_program_flags();
    flags["--critic-init"] = "algo.critic_init";
    if (!troupe::rl::parse_program_command_line("ppo", schema, argc, argv, flags)) return 0;   // --help, --print-config
  } catch (const std::invalid_argument& e) {
    std::cerr << "ppo: " << e.what() << "\n";
    return 2;
  }
  return troupe::rl::run_and_report("ppo", rt, config);
}
