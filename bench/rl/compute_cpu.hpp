// Which CPU each way of an RL bench computes on. On a VM the vCPUs need not be equally fast, nor
// stay so: on the 2-vCPU VM these benches are measured on, the same chunk of arithmetic timed on
// each vCPU in turn (build/bench/vcpu_speed, 2026-12-05) ran within 1.05 x as long on one as on the
// other in most 1 s windows of a quiet stretch, and 1.2-2.4 x for seconds at a time, the slower one
// changing. A worker
// process and the plain loop left to the kernel compute on whichever vCPUs it gives them, and
// their ratio then measures the two vCPUs as much as troupe: fixed pins showed it (rl_step's DPO,
// 200 steps, the worker process on the other vCPU than the driver: 1.173 and 1.080 with the vCPUs
// one way round and the other, then 1.005 and 1.166 a minute later). So each way computes on the
// same CPU: the thread that runs the plain loop and the in-process actors' methods, and the worker
// processes' actor threads (the k-th process's, oldest first, on the k-th allowed CPU from it on:
// PPO's critic, in a worker of its own, keeps a CPU of its own), while every other thread (the
// driver's while it only drives the workers' calls, the workers' link threads) runs where the
// kernel puts it, as unpinned. This compares like with like when each role computes on one thread
// (rl_step's defaults: trainer_threads 1, --blas-threads 1): threads an actor thread starts inherit
// its name, and so go on its CPU, where the plain loop's pool threads would run anywhere. Linux only
// (sched_setaffinity, /proc).
#pragma once

#include <dirent.h>
#include <sched.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <set>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "troupe/proc_file.hpp"

namespace troupe::bench_rl {

// The entries of a /proc directory that are numbers (pids, thread ids).
inline std::vector<pid_t> numeric_entries(const std::string& dir) {
  std::vector<pid_t> out;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return out;
  while (const dirent* e = ::readdir(d)) {
    char* end = nullptr;
    const long v = std::strtol(e->d_name, &end, 10);
    if (end != e->d_name && *end == '\0' && v > 0) out.push_back(pid_t(v));
  }
  ::closedir(d);
  return out;
}

// Every thread of process `pid` onto `set`, or only those named `only` (comm) when it is not empty
// (the others onto `rest`); a thread (or the process) that has ended is skipped. How many went
// onto `set`.
inline int pin_process(pid_t pid, const cpu_set_t& set, const std::string& only = "", const cpu_set_t* rest = nullptr) {
  if (!only.empty() && rest == nullptr) throw std::invalid_argument("pin_process: `only` without `rest`");
  const std::string dir = "/proc/" + std::to_string(pid) + "/task/";
  std::string comm;
  int pinned = 0;
  for (pid_t tid : numeric_entries(dir)) {
    const cpu_set_t* to = &set;
    if (!only.empty()) {
      if (read_proc_file(dir + std::to_string(tid) + "/comm", comm) != 0) continue;
      if (comm != only + "\n") to = rest;
    }
    if (::sched_setaffinity(tid, sizeof *to, to) == 0) pinned += to == &set ? 1 : 0;
    else if (errno != ESRCH) throw std::system_error(errno, std::generic_category(), "sched_setaffinity of thread " + std::to_string(tid));
  }
  return pinned;
}

// The live descendants of process `root` (its worker processes), oldest first.
inline std::vector<pid_t> descendants(pid_t root) {
  struct Proc {
    pid_t pid, ppid;
    unsigned long long start;
  };
  std::vector<Proc> all;
  for (pid_t pid : numeric_entries("/proc")) {
    const auto f = proc_stat_fields(pid);   // f[0] state, f[1] ppid, f[19] starttime
    if (f.size() < 20 || f[0] == "Z" || f[0] == "X") continue;
    all.push_back(Proc{pid, pid_t(std::strtol(f[1].c_str(), nullptr, 10)), std::strtoull(f[19].c_str(), nullptr, 10)});
  }
  std::set<pid_t> ours{root};
  for (bool grew = true; grew;) {   // children, their children, ...
    grew = false;
    for (const auto& p : all)
      if (ours.count(p.ppid) != 0 && ours.insert(p.pid).second) grew = true;
  }
  std::vector<Proc> found;
  for (const auto& p : all)
    if (p.pid != root && ours.count(p.pid) != 0) found.push_back(p);
  std::sort(found.begin(), found.end(), [](const Proc& a, const Proc& b) { return std::pair(a.start, a.pid) < std::pair(b.start, b.pid); });
  std::vector<pid_t> out;
  for (const auto& p : found) out.push_back(p.pid);
  return out;
}

// The first CPU this process may run on (0 if that cannot be read).
inline int first_allowed_cpu() {
  cpu_set_t s;
  CPU_ZERO(&s);
  if (::sched_getaffinity(0, sizeof s, &s) == 0)
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &s)) return c;
  return 0;
}

class ComputeCpu {
 public:
  static constexpr const char* kActorThread = "caf.actor";   // a detached actor's own thread (CAF names it)

  // `cpu` < 0: nothing is pinned (the kernel places every thread, as without this class). Worker
  // processes alive now are not this bench's (an earlier one's, still ending): they are left alone.
  // The CPUs this thread may run on now are the ones "every CPU" means below.
  explicit ComputeCpu(int cpu) : cpu_(cpu) {
    CPU_ZERO(&start_);
    if (::sched_getaffinity(0, sizeof start_, &start_) != 0) throw std::system_error(errno, std::generic_category(), "sched_getaffinity");
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &start_)) allowed_.push_back(c);
    if (cpu_ >= 0 && std::find(allowed_.begin(), allowed_.end(), cpu_) == allowed_.end())
      throw std::invalid_argument("--compute-cpu " + std::to_string(cpu_) + ": not one of the CPUs this process may run on (" +
                                  cpu_list() + ")");
    for (pid_t p : descendants(::getpid())) before_.insert(p);
  }
  // This process's threads back on the CPUs it started with: the next ComputeCpu reads them there
  // (a thread's affinity is what sched_getaffinity reads, and what the threads and processes it
  // starts inherit).
  ~ComputeCpu() {
    if (cpu_ < 0) return;
    try {
      pin_process(::getpid(), start_);
    } catch (const std::exception&) {   // a destructor does not throw; the process ends soon after
    }
  }
  ComputeCpu(const ComputeCpu&) = delete;
  ComputeCpu& operator=(const ComputeCpu&) = delete;

  std::string cpu_list() const {
    std::string s;
    for (int c : allowed_) s += (s.empty() ? "" : ",") + std::to_string(c);
    return s;
  }

  // Before a step of the plain loop or of the in-process actors: this thread on `cpu` (the plain
  // loop's, and the one the in-process actors' methods run on: rl::Run's calls are call_sync),
  // this process's other threads on every CPU it started with (an in-process actor that computes
  // while another does, on its own thread, may do so on another CPU, as it would unpinned).
  void here() const {
    if (cpu_ < 0) return;
    pin_process(::getpid(), start_);
    const cpu_set_t mine = one(cpu_);
    if (::sched_setaffinity(0, sizeof mine, &mine) != 0) throw std::system_error(errno, std::generic_category(), "sched_setaffinity");
  }

  // Every thread of this process, and every thread it starts from now on, on `cpu`.
  void whole_process() const {
    if (cpu_ >= 0) pin_process(::getpid(), one(cpu_));
  }

  // Before a step through worker processes: this bench's k-th worker process (oldest first) on the
  // k-th allowed CPU from `cpu` on (round the list), this process on every CPU it started with.
  void workers() const {
    if (cpu_ < 0) return;
    const auto first = std::size_t(std::find(allowed_.begin(), allowed_.end(), cpu_) - allowed_.begin());
    std::vector<pid_t> ours;
    for (pid_t p : descendants(::getpid()))
      if (before_.count(p) == 0) ours.push_back(p);
    // First off the workers' CPUs (when that leaves one), then free: the thread here() put on `cpu`
    // would otherwise stay there, and share it with the worker computing there until the kernel
    // balanced them (seen: this thread, looking for a reply, took slices of that CPU for ~20 ms
    // while the other one idled). Left to the kernel, the two would not start on one CPU.
    cpu_set_t off = start_;
    for (std::size_t k = 0; k < ours.size() && k < allowed_.size(); ++k) CPU_CLR(allowed_[(first + k) % allowed_.size()], &off);
    if (CPU_COUNT(&off) > 0) pin_process(::getpid(), off);
    pin_process(::getpid(), start_);
    // Workers this process did not start (a cluster's nodes started them), or none named as CAF
    // names an actor's thread: they would compute wherever the kernel put them. Said, not measured.
    if (ours.empty()) throw std::runtime_error("compute_cpu: no worker process of this bench runs here (--compute-cpu -1 leaves them unpinned)");
    int pinned = 0;
    for (std::size_t k = 0; k < ours.size(); ++k)
      pinned += pin_process(ours[k], one(allowed_[(first + k) % allowed_.size()]), kActorThread, &start_);
    if (pinned == 0) throw std::runtime_error("compute_cpu: no thread named " + std::string(kActorThread) + " in the worker processes");
  }

 private:
  static cpu_set_t one(int c) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(c, &s);
    return s;
  }

  int cpu_;
  cpu_set_t start_;
  std::vector<int> allowed_;
  std::set<pid_t> before_;
};

}  // namespace troupe::bench_rl
