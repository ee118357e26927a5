// examples/grpo: `make demo`. A small transformer learns multi-digit addition: a short SFT warm
// start, then GRPO as an actor graph (trainer, rollout engine, reference, reward) on the embedded
// cluster. Prints a live progress line on stderr and, as its last stdout line, one JSON object:
//   {"sft_heldout_acc":..,"final_heldout_acc":..,"steps":..,"seconds":..,"metrics":"..","plot":"..",...}
// Settings: RunConfig::demo() (also shipped as examples/configs/grpo.toml), then a --config FILE's
// keys, then each --set KEY=VALUE, then the flags below; --troupe-* flags configure the runtime.
#include <cmath>
#include <cstdint>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "troupe/rl.hpp"

namespace {

troupe::rl::RunConfig parse(int argc, char** argv) {
  auto c = troupe::rl::RunConfig::demo();
  try {   // the file and the --set keys first, so that a flag given too wins over them
    auto schema = troupe::rl::run_config_schema(c);
    troupe::rl::apply_command_line(schema, argc, argv);
  } catch (const std::invalid_argument& e) {
    std::cerr << "grpo: " << e.what() << "\n";
    std::exit(2);
  }
  CLI::App app{"GRPO on a verifiable task, on troupe"};
  app.allow_extras();
  std::string config_file;   // applied above; named here for --help and so that CLI11 accepts them
  std::vector<std::string> sets;
  app.add_option("--config", config_file, "a TOML configuration (examples/configs/grpo.toml has every key)");
  app.add_option("--set", sets, "KEY=VALUE: one key of the configuration, e.g. algo.kl_coef=0.02 (repeatable)");
  app.add_option("--task", c.task.spec, "task spec, e.g. addition:1-3");
  app.add_option("--train-size", c.task.train_size, "train problems");
  app.add_option("--heldout-size", c.task.heldout_size, "held-out problems");
  app.add_option("--steps", c.algo.steps, "GRPO steps");
  app.add_option("--sft-steps", c.algo.sft.steps,
                 "SFT warm-start steps: the least while its loss is above --sft-target-nll, 0 skips the warm start");
  app.add_option("--sft-target-nll", c.algo.sft.target_nll,
                 "the warm start's loss floor: it trains past --sft-steps while its loss is above this (0: exactly "
                 "--sft-steps, e.g. for a short run)");
  app.add_option("--sft-max-steps", c.algo.sft.max_steps, "the warm start's most steps, with --sft-target-nll");
  app.add_option("--sft-stop-nll", c.algo.sft.stop_nll, "the warm start's loss ceiling: it ends as soon as its loss is under this");
  app.add_option("--sft-lr", c.algo.sft.optim.lr, "SFT learning rate");
  app.add_option("--prompts", c.algo.prompts_per_step, "prompts per GRPO step");
  app.add_option("--group", c.algo.group_size, "samples per prompt (G)");
  app.add_option("--lr", c.algo.optim.lr, "GRPO learning rate");
  app.add_option("--kl", c.algo.kl_coef, "KL coefficient (beta)");
  app.add_option("--reward", c.algo.reward, "rule (the task's verifier) or model:PATH (a reward model from build/bin/reward_model)");
  app.add_option("--clip", c.algo.clip_eps, "ratio clip epsilon");
  app.add_option("--temperature", c.algo.temperature, "sampling temperature");
  app.add_option("--updates", c.algo.updates_per_batch, "optimizer steps per batch (mu)");
  app.add_option("--micro-batches", c.algo.micro_batches, "gradient accumulation parts");
  app.add_option("--layers", c.model.policy.layers, "transformer layers");
  app.add_option("--d-model", c.model.policy.d_model, "transformer width");
  app.add_option("--heads", c.model.policy.heads, "attention heads");
  app.add_option("--eval-every", c.run.eval_every, "held-out evaluation period (steps)");
  app.add_option("--checkpoint-every", c.run.checkpoint_every, "checkpoint period (steps; 0: at the end)");
  app.add_option("--seed", c.run.seed, "run seed")   // as a TOML integer can hold it (the run dir's config.toml reads back)
      ->check(CLI::Range(std::uint64_t(0), std::uint64_t(std::numeric_limits<std::int64_t>::max())));
  int threads = c.placement.trainer_threads;
  auto* threads_flag = app.add_option("--threads", threads, "libtorch intra-op threads of each compute actor");
  app.add_option("--run-dir", c.run.run_dir, "output directory (metrics, plot, checkpoints)");
  app.add_flag("--worker-processes", c.placement.worker_processes,
               "trainer, rollout and reference colocated in one worker process (the rule verifier stays in this one)");
  app.add_option("--rollouts", c.placement.rollouts,
                 "rollout engines MIN:MAX (default 1:1): engine 0 beside the trainer, the others an elastic group of "
                 "worker processes that grows and shrinks with the cluster; the samples do not depend on it");
  app.add_flag("--resume", c.run.resume, "continue from the newest checkpoint in --run-dir");
  app.add_option("--stop-after", c.run.stop_after, "stop after this many steps (checkpointed)");
  bool print_config = false;
  app.add_flag("--print-config", print_config, "print the resolved configuration (TOML, every key) and exit");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    std::exit(app.exit(e));
  }
  const auto extra = app.remaining();   // the runtime's flags (troupe::init read them) and their values; nothing else
  for (std::size_t i = 0; i < extra.size(); ++i) {
    const std::string& a = extra[i];
    if (troupe::rl::is_runtime_flag(a)) {
      if (a.find('=') == std::string::npos) ++i;
      continue;
    }
    std::cerr << "grpo: unknown argument '" << a << "' (grpo --help lists the flags)\n";
    std::exit(2);
  }
  if (threads_flag->count() > 0) c.placement.trainer_threads = c.placement.rollout_threads = c.placement.reference_threads = threads;
  if (print_config) {
    std::cout << "# build/bin/grpo's configuration (grpo --print-config); run it with grpo --config FILE\n"
              << troupe::rl::run_config_schema(c).to_toml();
    std::exit(0);
  }
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  auto rt = troupe::init(argc, argv);
  auto config = parse(argc, argv);
  return troupe::rl::run_and_report("grpo", rt, config);
}
