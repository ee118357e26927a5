// rl_step: the cost of running an algorithm as an actor graph. For each of GRPO, PPO, DPO and
// reward-model training, the same steps of the demo configuration (64 prompts x 8 samples; 64
// pairs per reward-model step) run three ways, interleaved step by step so that machine load drifts
// hit all alike, in an order that turns each step (none always follows the same way: with a fixed
// order the in-process rollout, run right after the plain loop's step, timed 0.93-0.95 x the plain
// loop's generate, and 0.97-0.99 x in the turning order; 2026-12-05, DPO):
//   in_process  rl::Run's step (or, for the reward model, a Trainer actor called as
//               build/bin/reward_model calls it): every role an actor of this process, every call
//               msgpack-encoded; Run's calls are call_sync, so an idle actor's method runs on the
//               driver's thread (runtime/include/troupe/actor_ref.hpp);
//   workers     the same with worker processes (placement.worker_processes: trainer and rollout
//               colocated in one worker with the reference, PPO's critic in its own, the rule verifier
//               in the driver's process: rl/include/troupe/rl/run.hpp, PlacementConfig), the
//               worker's roles sharing their threads (placement.share_threads; --share-threads 0:
//               each role's calls on its own thread);
//   plain       the same actor classes as plain objects (plain_roles.hpp), called directly in one thread with the same
//               math (the algorithms' batch builders, algorithms.hpp): one plain libtorch loop.
// Each way computes on the same CPU (--compute-cpu, default the first this process may run on;
// compute_cpu.hpp): the thread that runs the plain loop and the in-process methods, and the worker
// processes' actor threads (PPO's critic, in a worker of its own, on the next CPU). A VM's vCPUs
// need not compute equally fast, nor stay so (build/bench/vcpu_speed): left to the kernel, a worker
// process and the plain loop landed on different vCPUs, and overhead_ratio_workers measured them
// as much as troupe (DPO, 200 steps, 2026-12-05: 0.965-1.14 unpinned in the hour its pinned runs
// gave 1.084-1.128). --compute-cpu -1 leaves every thread to the kernel, as before.
// PPO runs with build/bin/ppo's settings. Every algorithm runs with OpenBLAS at one thread
// (--blas-threads, default 1: the one CPU each role holds), in every process while its runs last,
// the plain loop's steps included (actors/blas.hpp). OpenBLAS's own pool is as wide as the machine,
// in each process, and an idle pool thread spins ~0.1 s after each call: with the worker processes
// that was one process's pool spinning on the core another computed on (2026-12-04, four
// alternating pairs of 40 GRPO steps: workers' ratio 1.04-1.16 with the default pools, 0.96-1.04
// at one thread; the plain loop's step 81-105 ms and 101-105 ms).
// GRPO runs with beta 0.04 (the reference in its step, as this bench measured it before the demo
// dropped the KL term). All three start from the same SFT weights and draw the same prompts and seeds; `same_math` checks
// that their rewards and losses match step for step. Prints one JSON object with a key per
// algorithm: step_ms, median_step_ms, tokens_per_s, the split per phase of each way and actor_ms
// (the time inside the rollout's generate and the trainer's train steps, as they measured it), and
// overhead_ratio = in_process / plain and overhead_ratio_workers = workers / plain (by mean step
// time; median_* by median); actor_ratio_workers, per role, the workers' actor_ms over the plain
// loop's (the roles' own methods in the worker processes, the calls around them left out). The
// top-level "troupe", "plain" and "overhead_ratio" repeat GRPO's in-process figures under the keys
// this program printed before it covered the other algorithms.
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "compute_cpu.hpp"
#include "plain_roles.hpp"
#include "troupe/rl.hpp"

namespace {

using namespace troupe;
using namespace troupe::bench_rl;

Sample from_record(const rl::StepRecord& r) {
  return Sample{r.seconds, r.actor_seconds, r.tokens_per_s * r.seconds.total, r.reward_mean, r.loss};
}

// The three ways' summaries and ratios of one algorithm.
nlohmann::ordered_json report(const std::vector<Sample>& in_process, const std::vector<Sample>& workers,
                              const std::vector<Sample>& plain, bool same_math, bool same_math_workers) {
  nlohmann::ordered_json j;
  j["in_process"] = summarise(in_process);
  j["workers"] = summarise(workers);
  j["plain"] = summarise(plain);
  put_ratio(j, "overhead_ratio", "in_process", "plain");
  put_ratio(j, "overhead_ratio_workers", "workers", "plain");
  // The roles' own methods in the worker processes against the plain loop's (actor_ms): how much of
  // overhead_ratio_workers is the worker's compute speed rather than the calls around it.
  nlohmann::ordered_json speed = nlohmann::ordered_json::object();
  for (const auto& [role, ms] : j["workers"]["actor_ms"].items()) {
    const double base = j["plain"]["actor_ms"].value(role, 0.0);
    if (base > 0) speed[role] = ratio3(ms.get<double>(), base);
  }
  j["actor_ratio_workers"] = speed;
  j["same_math"] = same_math;
  j["same_math_workers"] = same_math_workers;
  return j;
}

// GRPO, PPO or DPO: an in-process rl::Run, a worker-process one and the plain loop, interleaved.
nlohmann::ordered_json bench_algorithm(Runtime& rt, rl::RunConfig config, const std::string& sft, int warmup, int steps,
                                       int compute_cpu, bool share_threads) {
  const ComputeCpu pin(compute_cpu);   // before the Runs: their worker processes are this bench's
  rl::RunConfig workers_config = config;
  workers_config.placement.worker_processes = true;
  workers_config.placement.share_threads = share_threads;
  workers_config.run.run_dir += "-workers";
  rl::Run in_process(rt, config), workers(rt, workers_config);
  in_process.warm_start();   // no SFT steps: init_weights are the SFT weights
  workers.warm_start();
  PlainRoles plain(in_process.config(), sft);
  std::vector<Sample> a, b, c;
  bool same_math = true, same_math_workers = true;
  for (int i = 0; i < warmup + steps; ++i) {
    auto cursor = in_process.state().cursor;
    const auto step = in_process.state().step;
    Sample x, y, z;
    for (int k = 0; k < 3; ++k) {   // each way first, second and third in turn: none always follows the same one
      const int way = (i + k) % 3;
      if (way == 1) pin.workers();
      else pin.here();
      if (way == 0) x = from_record(in_process.step());
      else if (way == 1) y = from_record(workers.step());
      else z = plain.step(cursor, step);
    }
    same_math = same_math && same(x, z);
    same_math_workers = same_math_workers && same(y, z);
    if (i >= warmup) { a.push_back(x); b.push_back(y); c.push_back(z); }
  }
  auto j = report(a, b, c, same_math, same_math_workers);
  j["blas_threads"] = config.placement.blas_threads;
  j["share_threads"] = share_threads;
  return j;
}

// Reward-model training (Bradley-Terry on pairs of a correct and a wrong answer, the SFT trunk with
// a score head): a Trainer actor on a thread, one in a worker process, and a plain Trainer.
nlohmann::ordered_json bench_reward_model(Runtime& rt, const rl::RunConfig& demo, const std::string& sft, int warmup, int steps,
                                          int pairs_per_step, int compute_cpu) {
  const auto task = rl::make_task(demo.task.spec);
  const actors::CharTokenizer tok(task->alphabet());
  actors::PolicyConfig model = demo.model.policy;
  model.vocab_size = tok.vocab_size();
  model.seed = demo.run.seed;
  model.scalar_heads = {"score"};
  const auto data = rl::Dataset::make(*task, demo.task.train_size, demo.task.heldout_size, demo.run.seed, demo.task.heldout_kind_share);
  actors::OptimConfig optim;
  optim.lr = 1e-4;
  optim.warmup_steps = 20;
  const actors::TrainerConfig tc{model, optim, demo.placement.trainer_threads, demo.placement.blas_threads};
  const ComputeCpu pin(compute_cpu);
  auto thread = rt.spawn<actors::Trainer>(Options{}.name("rm_thread"), tc);
  auto worker = rt.spawn<actors::Trainer>(Options{}.name("rm_worker").process(true), tc);
  actors::Trainer plain(tc);
  thread.call(&actors::Trainer::load_trunk, sft).get();
  worker.call(&actors::Trainer::load_trunk, sft).get();
  plain.load_trunk(sft);
  rl::DataCursor cursor{demo.run.seed ^ 0x7a1, 0, 0};
  std::vector<Sample> a, b, c;
  bool same_math = true, same_math_workers = true;
  auto timed = [](const std::function<actors::TrainMetrics()>& f) {
    const auto t = Clock::now();
    Sample s;
    const auto m = f();
    s.loss = m.loss;
    s.actor.train = m.seconds;
    s.tokens = double(m.tokens);   // trained tokens: tokens_per_s is the training throughput
    s.seconds.train = s.seconds.total = since(t);
    return s;
  };
  for (int i = 0; i < warmup + steps; ++i) {
    std::vector<rl::PreferencePair> pairs;   // the correct answer against a wrong one of the same format
    for (auto& p : cursor.next(data.train, std::size_t(pairs_per_step)))
      pairs.push_back(rl::PreferencePair{p, p.answer, std::to_string(std::stoll(p.answer) + 1)});
    const auto batch = rl::reward_model_batch(pairs, tok);
    Sample x, y, z;
    for (int k = 0; k < 3; ++k) {   // in turn, as bench_algorithm's ways
      const int way = (i + k) % 3;
      if (way == 1) pin.workers();
      else pin.here();
      if (way == 0) x = timed([&] { return thread.call_sync(&actors::Trainer::train_step, batch); });
      else if (way == 1) y = timed([&] { return worker.call_sync(&actors::Trainer::train_step, batch); });
      else z = timed([&] { return plain.train_step(batch); });
    }
    same_math = same_math && same(x, z);
    same_math_workers = same_math_workers && same(y, z);
    if (i >= warmup) { a.push_back(x); b.push_back(y); c.push_back(z); }
  }
  rt.kill(thread);
  rt.kill(worker);
  auto j = report(a, b, c, same_math, same_math_workers);
  j["blas_threads"] = demo.placement.blas_threads;
  return j;
}

}  // namespace

int main(int argc, char** argv) {
  auto rt = troupe::init(argc, argv);   // a worker process of this bench returns never
  int steps = 20, warmup = 3, sft_steps = 100, rm_pairs = 64, blas = 1, compute_cpu = first_allowed_cpu();
  bool share_threads = true;
  std::string algorithms = "grpo,ppo,dpo,reward_model";
  CLI::App app{"one step of each algorithm: troupe actors (in-process and in worker processes) vs a plain loop"};
  app.allow_extras();
  add_length_options(app, steps, warmup, sft_steps);
  app.add_option("--algorithms", algorithms, "comma-separated: grpo, ppo, dpo, reward_model");
  app.add_option("--blas-threads", blas,
                 "OpenBLAS threads for every algorithm (placement.blas_threads; default 1; 0: the default pool); -1: each its own (ppo 1)");
  app.add_option("--compute-cpu", compute_cpu,
                 "the CPU every way computes on (compute_cpu.hpp; default: the first this process may run on); -1: the kernel places them");
  app.add_option("--share-threads", share_threads,
                 "workers: the worker's roles share their threads (placement.share_threads; default 1); 0: each its own");
  CLI11_PARSE(app, argc, argv);
  std::vector<std::string> names;
  try {
    names = algorithm_names(algorithms, {"grpo", "ppo", "dpo", "reward_model"});
    (void)ComputeCpu(compute_cpu);   // one this process may run on
  } catch (const std::invalid_argument& e) {
    std::cerr << "rl_step: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {   // sched_getaffinity refused
    std::cerr << "rl_step: " << e.what() << "\n";
    return 1;
  }

  auto demo = rl::RunConfig::demo();
  try {   // an actor that died, a worker that could not start: said, with the status, not an abort
    const ScratchDir scratch("rl_step");
    const std::string& dir = scratch.path();
    const std::string sft = dir + "/sft.safetensors";
    save_sft_start(demo, sft_steps, sft);   // the shared start: the demo's SFT warm start, shortened
    nlohmann::ordered_json out;
    out["bench"] = "rl_step";
    out["config"] = {{"task", demo.task.spec}, {"layers", demo.model.policy.layers}, {"d_model", demo.model.policy.d_model},
                     {"prompts_per_step", demo.algo.prompts_per_step}, {"group_size", demo.algo.group_size}, {"rm_pairs_per_step", rm_pairs},
                     {"threads_per_actor", demo.placement.trainer_threads}, {"sft_steps", sft_steps}, {"steps", steps},
                     {"compute_cpu", compute_cpu >= 0 ? nlohmann::ordered_json(compute_cpu) : nlohmann::ordered_json()}};
    for (const auto& name : names) {
      if (name == "reward_model") {
        rl::RunConfig c = demo;
        if (blas >= 0) c.placement.blas_threads = blas;
        out[name] = bench_reward_model(rt, c, sft, warmup, steps, rm_pairs, compute_cpu);
        continue;
      }
      out[name] = bench_algorithm(rt, bench_config(demo, name, blas, sft, dir + "/" + name), sft, warmup, steps, compute_cpu,
                                  share_threads);
    }
    if (out.contains("grpo")) {
      out["troupe"] = out["grpo"]["in_process"];
      out["plain"] = out["grpo"]["plain"];
      out["overhead_ratio"] = out["grpo"]["overhead_ratio"];
      out["median_overhead_ratio"] = out["grpo"]["median_overhead_ratio"];
      out["same_math"] = out["grpo"]["same_math"];
    }
    std::cout << out.dump() << std::endl;
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "rl_step: " << e.what() << "\n";
    return 1;
  }
}
