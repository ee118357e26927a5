// phase_threads: what it costs to run an algorithm's phases on threads of their own, with no actor
// runtime in the way. rl_step's plain loop (plain_roles.hpp) runs the same steps three ways,
// interleaved step by step so that machine load drifts hit all alike, in an order that turns each
// step (which way follows which changes what is left in the caches), each way with its own roles
// from one SFT start:
//   main             every phase on the main thread (rl_step's `plain`);
//   one_thread       every phase handed, in turn, to one other thread: a worker process whose
//                    colocated roles would run their calls on one thread;
//   thread_per_role  each role's phases handed to a thread of that role's: a worker process today,
//                    where each actor has a host thread of its own (rl::PlacementConfig).
// The verifier scores on the main thread in every way (rl::Run's driver keeps it). A hand-over is
// one condition-variable wake each way while the main thread waits, the same in the last two ways,
// so what tells them apart is only which thread a phase runs on. Every thread runs on one CPU
// (--compute-cpu; compute_cpu.hpp: a VM's vCPUs need not compute equally fast, and a phase handed
// to a thread on another vCPU would measure that too). Prints one JSON object: per
// algorithm, each way's summary (plain_roles.hpp: step_ms, split_ms, actor_ms, ...), one_thread_ratio
// and thread_per_role_ratio (that way's mean step over main's; median_* by median step), and
// same_math (the three took the same steps, bit for bit).
#include <condition_variable>
#include <exception>
#include <iostream>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

#include <CLI/CLI.hpp>

#include "compute_cpu.hpp"
#include "plain_roles.hpp"

namespace {

using namespace troupe;
using namespace troupe::bench_rl;

// A thread that runs one phase at a time for the main thread, which waits for it.
class PhaseThread {
 public:
  PhaseThread() : thread_([this] { loop(); }) {}
  ~PhaseThread() {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  PhaseThread(const PhaseThread&) = delete;
  PhaseThread& operator=(const PhaseThread&) = delete;

  // Runs `phase` on this thread; returns once it has, rethrowing what it threw.
  void run(const std::function<void()>& phase) {
    std::unique_lock lk(mu_);
    job_ = &phase;
    done_ = false;
    cv_.notify_all();
    cv_.wait(lk, [&] { return done_; });
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }

 private:
  void loop() {
    std::unique_lock lk(mu_);
    for (;;) {
      cv_.wait(lk, [&] { return stop_ || job_ != nullptr; });
      if (job_ == nullptr) return;
      const auto* job = std::exchange(job_, nullptr);
      lk.unlock();
      std::exception_ptr error;
      try {
        (*job)();
      } catch (...) {
        error = std::current_exception();
      }
      lk.lock();
      error_ = error;
      done_ = true;
      cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  const std::function<void()>* job_ = nullptr;
  bool done_ = false, stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;   // last: it starts once the rest exists
};

class OneThread final : public PhaseRunner {
 public:
  void run(Role, const std::function<void()>& phase) override { thread_.run(phase); }

 private:
  PhaseThread thread_;
};

class ThreadPerRole final : public PhaseRunner {
 public:
  void run(Role role, const std::function<void()>& phase) override {
    switch (role) {
      case Role::rollout: rollout_.run(phase); break;
      case Role::reference: reference_.run(phase); break;
      case Role::trainer: trainer_.run(phase); break;
      case Role::critic: critic_.run(phase); break;
    }
  }

 private:
  PhaseThread rollout_, reference_, trainer_, critic_;
};

nlohmann::ordered_json bench_algorithm(rl::RunConfig c, const std::string& sft, int warmup, int steps) {
  c.model.policy.vocab_size = actors::CharTokenizer(rl::make_task(c.task.spec)->alphabet()).vocab_size();   // as rl::Run resolves them
  c.model.policy.seed = c.run.seed;
  OneThread one;
  ThreadPerRole per_role;
  PlainRoles main_roles(c, sft), one_roles(c, sft, &one), per_role_roles(c, sft, &per_role);
  rl::DataCursor cursor{c.run.seed ^ 0x9e3, 0, 0};
  std::vector<Sample> timed[3];   // each way's, in roles' order
  bool same_math = true;
  PlainRoles* roles[3] = {&main_roles, &one_roles, &per_role_roles};
  for (int i = 0; i < warmup + steps; ++i) {
    Sample x[3];
    const rl::DataCursor at = cursor;
    for (int k = 0; k < 3; ++k) {   // each way first, second and third in turn: none always follows the same one
      const int way = (i + k) % 3;
      rl::DataCursor c = at;
      x[way] = roles[way]->step(c, i);
      cursor = c;
    }
    same_math = same_math && same(x[0], x[1]) && same(x[0], x[2]);
    for (int k = 0; i >= warmup && k < 3; ++k) timed[k].push_back(x[k]);
  }
  nlohmann::ordered_json j;
  j["main"] = summarise(timed[0]);
  j["one_thread"] = summarise(timed[1]);
  j["thread_per_role"] = summarise(timed[2]);
  put_ratio(j, "one_thread_ratio", "one_thread", "main");
  put_ratio(j, "thread_per_role_ratio", "thread_per_role", "main");
  j["same_math"] = same_math;
  j["blas_threads"] = c.placement.blas_threads;
  return j;
}

}  // namespace

int main(int argc, char** argv) {
  auto rt = troupe::init(argc, argv);   // a troupe process's malloc settings (process_memory.hpp), as rl_step's
  int steps = 200, warmup = 3, sft_steps = 100, blas = 1, compute_cpu = first_allowed_cpu();
  std::string algorithms = "dpo";
  CLI::App app{"an algorithm's phases on the main thread, on one other thread, and on a thread per role (plain loop)"};
  app.allow_extras();
  add_length_options(app, steps, warmup, sft_steps);
  app.add_option("--algorithms", algorithms, "comma-separated: grpo, ppo, dpo");
  app.add_option("--blas-threads", blas, "OpenBLAS threads (placement.blas_threads; default 1); -1: each algorithm's own");
  app.add_option("--compute-cpu", compute_cpu,
                 "the CPU every thread runs on (compute_cpu.hpp; default: the first this process may run on); -1: the kernel places them");
  CLI11_PARSE(app, argc, argv);
  std::vector<std::string> names;
  std::unique_ptr<ComputeCpu> pin;   // while the benches run
  try {
    names = algorithm_names(algorithms, {"grpo", "ppo", "dpo"});
    pin = std::make_unique<ComputeCpu>(compute_cpu);
    pin->whole_process();
  } catch (const std::invalid_argument& e) {
    std::cerr << "phase_threads: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {   // sched_getaffinity / sched_setaffinity refused
    std::cerr << "phase_threads: " << e.what() << "\n";
    return 1;
  }
  const auto demo = rl::RunConfig::demo();
  try {
    const ScratchDir scratch("phase_threads");
    const std::string& dir = scratch.path();
    const std::string sft = dir + "/sft.safetensors";
    save_sft_start(demo, sft_steps, sft);
    nlohmann::ordered_json out;
    out["bench"] = "phase_threads";
    out["config"] = {{"task", demo.task.spec}, {"prompts_per_step", demo.algo.prompts_per_step}, {"group_size", demo.algo.group_size},
                     {"sft_steps", sft_steps}, {"steps", steps},
                     {"compute_cpu", compute_cpu >= 0 ? nlohmann::ordered_json(compute_cpu) : nlohmann::ordered_json()}};
    for (const auto& name : names) out[name] = bench_algorithm(bench_config(demo, name, blas, sft, dir + "/" + name), sft, warmup, steps);
    std::cout << out.dump() << std::endl;
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "phase_threads: " << e.what() << "\n";
    return 1;
  }
}
