// build/bench/actor_calls: Ray's actor microbenchmarks on troupe, in-process and cross-process
// (driver to actors in worker processes on this host, keys prefixed xproc_), beside the same
// in-process patterns on bare CAF. Prints one JSON object last: calls or actors per second, and
// under <key>_cpu_us the driver process's CPU microseconds per call (or per actor); then
//   xproc_first_call_after_ready_s  a new actor's first call, its worker process already running
//   death_notice_s                  kill -9 of a worker -> the caller's pending future has failed
//   idle_cpu_percent                a worker process with nothing to do, over 10 s (of one core)
//   parked_call_us                  one synchronous call 3 ms after the last, when caller and actor
//                                   have stopped looking for messages: its round trip, median of
//                                   200 (xproc_parked_call_us: to a worker process)
//   call_overhead_10ms_us           a call whose method computes for 10 ms, less the method's time:
//                                   median of 100 back to back (xproc_: to a worker process)
//   xproc_tensor_call_256k_us       a call to a worker process whose result is a 256 KiB tensor:
//                                   its round trip, median of 200 back to back
//   tcp_floor_rtt_us                a bare two-process TCP ping-pong (64 B) on 127.0.0.1, this run
//   ucx_am_busy_rtt_us              the same over UCX active messages (shared memory), both sides
//                                   busy-polling; ucx_am_wait_rtt_us: parking between messages
//   --seconds S   wall time per case (default 2)
//   --xproc-only  the cross-process patterns alone (xproc_* keys): for a profiler, or quick pairs
//   --only KEY    with --xproc-only: that pattern alone (1_1_actor_calls_sync, ...), e.g. under
//                 `perf stat -a -e raw_syscalls:sys_enter,context-switches` to count its system calls
#include <nlohmann/json.hpp>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>
#include <cstring>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.hpp"
#include "raw_caf.hpp"
#include "ucx_am.hpp"
#include "troupe/troupe.hpp"

struct Echo {
  int echo(int x) { return x; }
  int pid() { return int(::getpid()); }
  void sleep_ms(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }
  // Computes for `ms` milliseconds (a stand-in for a training step); returns the microseconds it took.
  double busy_ms(int ms) {
    const auto t0 = std::chrono::steady_clock::now();
    volatile double x = 0;
    while (std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(ms)) {
      for (int i = 0; i < 1000; ++i) x = x + 1.0;
    }
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  }
  // A tensor of `bytes` bytes (rollouts' tokens and logprobs come back so).
  troupe::TensorView tensor(std::int64_t bytes) {
    auto t = troupe::TensorView::empty(troupe::DType::U8, {bytes});
    std::memset(t.data, 7, std::size_t(bytes));
    return t;
  }
};
TROUPE_ACTOR(Echo, echo, pid, sleep_ms, busy_ms, tensor);

namespace {

using bench::kBatch;

void async_calls(const std::vector<troupe::ActorRef<Echo>>& as, int n) {
  std::vector<troupe::Future<int>> fs;
  fs.reserve(n);
  for (int i = 0; i < n; ++i) fs.push_back(as[i % as.size()].call(&Echo::echo, i));
  troupe::wait_all(fs);
}

// The five patterns over actors spawned with `opts`; keys get `prefix`. A non-empty `only` runs
// the pattern of that key alone.
void run_patterns(troupe::Runtime& rt, const troupe::Options& opts, int members_n, int creations,
                  double seconds, const std::string& prefix, std::map<std::string, double>& out,
                  const std::string& only = "") {
  auto group = rt.spawn_group<Echo>(std::size_t(members_n), opts);
  for (auto& m : group) m.ready().get();
  const auto& members = group.members();
  auto put = [&](const std::string& key, long ops_per_round, const std::function<void()>& round) {
    if (!only.empty() && key != only) return;
    const bench::Rate r = bench::measure(seconds, ops_per_round, round);
    out[prefix + key] = r.per_s;
    out[prefix + key + "_cpu_us"] = r.cpu_us;
  };
  put("1_1_actor_calls_sync", 200, [&] {
    for (int i = 0; i < 200; ++i) (void)members[0].call(&Echo::echo, i).get();
  });
  put("1_1_actor_calls_async", kBatch, [&] { async_calls({members[0]}, kBatch); });
  put("1_n_actor_calls_async", kBatch, [&] { async_calls(members, kBatch); });
  put("n_n_actor_calls_async", long(bench::kCallers) * kBatch, [&] {
    std::vector<std::thread> ts;
    for (int c = 0; c < bench::kCallers; ++c) ts.emplace_back([&] { async_calls(members, kBatch); });
    for (auto& t : ts) t.join();
  });
  for (auto& m : members) rt.kill(m);
  put("actor_creation_per_s", creations, [&] {
    auto g = rt.spawn_group<Echo>(std::size_t(creations), opts);
    (void)g.call_all(&Echo::echo, 1).get();
    for (auto& m : g) rt.kill(m);
  });
}

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// A new actor in a worker process that already runs (colocated with one there): its first call's
// round trip, once ready() has completed. Median of 5.
double first_call_after_ready(troupe::Runtime& rt) {
  auto host = rt.spawn<Echo>(troupe::Options{}.process(true));
  (void)host.call(&Echo::echo, 0).get();
  std::vector<double> times;
  for (int i = 0; i < 5; ++i) {
    auto fresh = rt.spawn<Echo>(troupe::Options{}.colocate_with(host));
    fresh.ready().get();
    auto t0 = Clock::now();
    (void)fresh.call(&Echo::echo, i).get();
    times.push_back(seconds_since(t0));
    rt.kill(fresh);
  }
  rt.kill(host);
  return median(times);
}

// One synchronous call after `gap` with nothing to do, so that caller and actor have stopped looking
// for messages (as between the calls of an RL step, each milliseconds long): its round trip in
// microseconds, median of 200. With `gap` 0 the same calls back to back.
double parked_call_us(troupe::Runtime& rt, const troupe::Options& opts, std::chrono::microseconds gap) {
  auto a = rt.spawn<Echo>(opts);
  (void)a.call(&Echo::echo, 0).get();
  std::vector<double> times;
  for (int i = 0; i < 200; ++i) {
    std::this_thread::sleep_for(gap);
    const auto t0 = Clock::now();
    (void)a.call(&Echo::echo, i).get();
    times.push_back(seconds_since(t0) * 1e6);
  }
  rt.kill(a);
  return median(times);
}

// Calls whose method computes for 10 ms, back to back: what each costs beyond its method (the
// method's own time taken off), median of 100. While it computes, its caller has nothing to do.
double call_overhead_10ms_us(troupe::Runtime& rt, const troupe::Options& opts) {
  auto a = rt.spawn<Echo>(opts);
  (void)a.call(&Echo::echo, 0).get();
  std::vector<double> times;
  for (int i = 0; i < 100; ++i) {
    const auto t0 = Clock::now();
    const double method_us = a.call(&Echo::busy_ms, 10).get();
    times.push_back(seconds_since(t0) * 1e6 - method_us);
  }
  rt.kill(a);
  return median(times);
}

// A call whose result is a tensor of 256 KiB (a rollout's tokens and logprobs are about that): its
// round trip in microseconds, median of 200, back to back.
double tensor_call_256k_us(troupe::Runtime& rt, const troupe::Options& opts) {
  auto a = rt.spawn<Echo>(opts);
  (void)a.call(&Echo::tensor, std::int64_t(1)).get();
  std::vector<double> times;
  for (int i = 0; i < 200; ++i) {
    const auto t0 = Clock::now();
    const troupe::TensorView t = a.call(&Echo::tensor, std::int64_t(256 << 10)).get();
    times.push_back(seconds_since(t0) * 1e6);
    if (t.nbytes() != std::size_t(256 << 10) || t.data_as<const unsigned char>()[1000] != 7) {
      std::fprintf(stderr, "actor_calls: a 256 KiB tensor came back wrong: no figure\n");   // not timed as if right
      rt.shutdown();
      std::exit(1);
    }
  }
  rt.kill(a);
  return median(times);
}

// kill -9 of a worker process with a call in flight: until that call's future has failed. Median of 3.
double death_notice(troupe::Runtime& rt) {
  std::vector<double> times;
  for (int i = 0; i < 3; ++i) {
    auto victim = rt.spawn<Echo>(troupe::Options{}.process(true));
    const int pid = victim.call(&Echo::pid).get();
    auto pending = victim.call(&Echo::sleep_ms, 30000);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));   // the call is running there
    auto t0 = Clock::now();
    ::kill(pid, SIGKILL);
    pending.wait();
    times.push_back(seconds_since(t0));
    if (pending.result().ok()) std::fprintf(stderr, "actor_calls: a call to a killed worker succeeded\n");
  }
  return median(times);
}

double process_cpu_seconds(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::istringstream rest(text.substr(text.rfind(')') + 2));
  std::string f;
  double ticks = 0;
  for (int i = 3; i <= 15 && rest >> f; ++i) {
    if (i == 14 || i == 15) ticks += std::stod(f);   // utime, stime
  }
  return ticks / double(::sysconf(_SC_CLK_TCK));
}

// A worker with one idle actor, its link to this driver open: CPU over 10 s, in % of one core.
double idle_cpu_percent(troupe::Runtime& rt) {
  auto idle = rt.spawn<Echo>(troupe::Options{}.process(true));
  const int pid = idle.call(&Echo::pid).get();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));   // start-up done
  const double c0 = process_cpu_seconds(pid);
  auto t0 = Clock::now();
  std::this_thread::sleep_for(std::chrono::seconds(10));
  const double pct = 100.0 * (process_cpu_seconds(pid) - c0) / seconds_since(t0);
  rt.kill(idle);
  return pct;
}

// A bare ping-pong of 64 B between two processes over TCP on 127.0.0.1 (blocking read/write):
// the floor a cross-process call sits on here. Mean round trip of 20,000 after 1,000.
double tcp_floor_rtt_us() {
  int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  ::inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  socklen_t len = sizeof a;
  if (::bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(listener, 1) != 0 ||
      ::getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    return -1;
  }
  int client = ::socket(AF_INET, SOCK_STREAM, 0);
  if (::connect(client, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return -1;
  int server = ::accept(listener, nullptr, nullptr);
  int one = 1;
  ::setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  ::setsockopt(server, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  ::close(listener);
  char buf[64] = {};
  pid_t child = ::fork();
  if (child == 0) {   // async-signal-safe calls only: this process has other threads
    ::close(client);
    for (;;) {
      ssize_t n = 0, got = 0;
      while (got < 64 && (n = ::read(server, buf + got, std::size_t(64 - got))) > 0) got += n;
      if (got < 64 || ::write(server, buf, 64) != 64) ::_exit(0);
    }
  }
  ::close(server);
  auto round = [&] {
    if (::write(client, buf, 64) != 64) return false;
    ssize_t n = 0, got = 0;
    while (got < 64 && (n = ::read(client, buf + got, std::size_t(64 - got))) > 0) got += n;
    return got == 64;
  };
  for (int i = 0; i < 1000; ++i) round();
  constexpr int kRounds = 20000;
  auto t0 = Clock::now();
  for (int i = 0; i < kRounds; ++i) round();
  const double us = seconds_since(t0) * 1e6 / kRounds;
  ::close(client);
  ::waitpid(child, nullptr, 0);
  return us;
}

}  // namespace

int main(int argc, char** argv) {
  if (bench::ucx_am_peer(argc, argv)) return 0;   // this process is the UCX ping-pong's other side
  auto rt = troupe::init(argc, argv);   // worker processes of the xproc cases run this binary too
  double seconds = 2.0;
  bool xproc_only = false;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--seconds") == 0 && i + 1 < argc) seconds = std::atof(argv[i + 1]);
    if (std::strcmp(argv[i], "--xproc-only") == 0) xproc_only = true;
    if (std::strcmp(argv[i], "--only") == 0 && i + 1 < argc) only = argv[i + 1];
  }
  if (seconds <= 0) {
    std::fprintf(stderr, "actor_calls: --seconds must be positive\n");
    return 2;
  }
  if (!only.empty() && !xproc_only) {
    std::fprintf(stderr, "actor_calls: --only needs --xproc-only\n");
    return 2;
  }
  std::map<std::string, double> troupe_figures;
  if (xproc_only) {
    run_patterns(rt, troupe::Options{}.process(true), bench::kCallers * 2, 4, seconds, "xproc_", troupe_figures, only);
    if (only.empty() || only == "parked_call_us") {
      troupe_figures["xproc_parked_call_us"] = parked_call_us(rt, troupe::Options{}.process(true), std::chrono::milliseconds(3));
    }
    if (only.empty() || only == "tensor_call_256k_us") {
      troupe_figures["xproc_tensor_call_256k_us"] = tensor_call_256k_us(rt, troupe::Options{}.process(true));
    }
    if (only.empty() || only == "call_overhead_10ms_us") {
      troupe_figures["xproc_call_overhead_10ms_us"] = call_overhead_10ms_us(rt, troupe::Options{}.process(true));
    }
    if (troupe_figures.empty()) {
      std::fprintf(stderr, "actor_calls: --only %s names no pattern\n", only.c_str());
      return 2;
    }
    rt.shutdown();
    nlohmann::json j;
    for (auto& [k, v] : troupe_figures) j[k] = k.ends_with("_us") ? std::round(v * 100) / 100 : std::round(v);
    std::cout << j.dump() << std::endl;
    return 0;
  }
  run_patterns(rt, troupe::Options{}, bench::kMembers, 100, seconds, "", troupe_figures);
  run_patterns(rt, troupe::Options{}.process(true), bench::kCallers * 2, 4, seconds, "xproc_", troupe_figures);
  troupe_figures["parked_call_us"] = parked_call_us(rt, troupe::Options{}, std::chrono::milliseconds(3));
  troupe_figures["xproc_parked_call_us"] = parked_call_us(rt, troupe::Options{}.process(true), std::chrono::milliseconds(3));
  troupe_figures["call_overhead_10ms_us"] = call_overhead_10ms_us(rt, troupe::Options{});
  troupe_figures["xproc_call_overhead_10ms_us"] = call_overhead_10ms_us(rt, troupe::Options{}.process(true));
  troupe_figures["xproc_tensor_call_256k_us"] = tensor_call_256k_us(rt, troupe::Options{}.process(true));
  const double first_call = first_call_after_ready(rt);
  const double death = death_notice(rt);
  const double idle = idle_cpu_percent(rt);
  rt.shutdown();
  nlohmann::json j;
  j["xproc_first_call_after_ready_s"] = first_call;
  j["death_notice_s"] = death;
  j["idle_cpu_percent"] = std::round(idle * 100) / 100;
  j["tcp_floor_rtt_us"] = std::round(tcp_floor_rtt_us() * 10) / 10;
  const auto am = bench::ucx_am_rtt(20000);
  j["ucx_am_busy_rtt_us"] = std::round(am.busy_rtt_us * 100) / 100;
  j["ucx_am_wait_rtt_us"] = std::round(am.wait_rtt_us * 10) / 10;
  for (auto& [k, v] : troupe_figures) j[k] = k.ends_with("_us") ? std::round(v * 100) / 100 : std::round(v);
  for (auto& [k, v] : bench::run_raw_caf(seconds)) j[k] = std::round(v);
  for (const char* k : {"1_1_actor_calls_sync", "1_1_actor_calls_async", "1_n_actor_calls_async",
                        "n_n_actor_calls_async", "actor_creation_per_s"}) {
    j[std::string("ratio_vs_raw_caf_") + k] = j[k].get<double>() / j[std::string("raw_caf_") + k].get<double>();
  }
  j["hardware_threads"] = std::thread::hardware_concurrency();
  std::cout << j.dump() << std::endl;
}
