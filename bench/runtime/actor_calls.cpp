// build/bench/actor_calls: Ray's actor microbenchmarks on troupe, in-process and cross-process
// (driver to actors in worker processes on this host, keys prefixed xproc_), beside the same
// in-process patterns on bare CAF. Prints one JSON object last: calls or actors per second, and
// under <key>_cpu_us the driver process's CPU microseconds per call (or per actor).
//   --seconds S   wall time per case (default 2)
#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.hpp"
#include "raw_caf.hpp"
#include "troupe/troupe.hpp"

struct Echo {
  int echo(int x) { return x; }
};
TROUPE_ACTOR(Echo, echo);

namespace {

using bench::kBatch;

void async_calls(const std::vector<troupe::ActorRef<Echo>>& as, int n) {
  std::vector<troupe::Future<int>> fs;
  fs.reserve(n);
  for (int i = 0; i < n; ++i) fs.push_back(as[i % as.size()].call(&Echo::echo, i));
  troupe::wait_all(fs);
}

// The five patterns over actors spawned with `opts`; keys get `prefix`.
void run_patterns(troupe::Runtime& rt, const troupe::Options& opts, int members_n, int creations,
                  double seconds, const std::string& prefix, std::map<std::string, double>& out) {
  auto group = rt.spawn_group<Echo>(std::size_t(members_n), opts);
  for (auto& m : group) m.ready().get();
  const auto& members = group.members();
  auto put = [&](const std::string& key, bench::Rate r) {
    out[prefix + key] = r.per_s;
    out[prefix + key + "_cpu_us"] = r.cpu_us;
  };
  put("1_1_actor_calls_sync", bench::measure(seconds, 200, [&] {
    for (int i = 0; i < 200; ++i) (void)members[0].call(&Echo::echo, i).get();
  }));
  put("1_1_actor_calls_async", bench::measure(seconds, kBatch, [&] { async_calls({members[0]}, kBatch); }));
  put("1_n_actor_calls_async", bench::measure(seconds, kBatch, [&] { async_calls(members, kBatch); }));
  put("n_n_actor_calls_async", bench::measure(seconds, long(bench::kCallers) * kBatch, [&] {
    std::vector<std::thread> ts;
    for (int c = 0; c < bench::kCallers; ++c) ts.emplace_back([&] { async_calls(members, kBatch); });
    for (auto& t : ts) t.join();
  }));
  for (auto& m : members) rt.kill(m);
  put("actor_creation_per_s", bench::measure(seconds, creations, [&] {
    auto g = rt.spawn_group<Echo>(std::size_t(creations), opts);
    (void)g.call_all(&Echo::echo, 1).get();
    for (auto& m : g) rt.kill(m);
  }));
}

}  // namespace

int main(int argc, char** argv) {
  auto rt = troupe::init(argc, argv);   // worker processes of the xproc cases run this binary too
  double seconds = 2.0;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--seconds") == 0) seconds = std::atof(argv[i + 1]);
  }
  if (seconds <= 0) {
    std::fprintf(stderr, "actor_calls: --seconds must be positive\n");
    return 2;
  }
  std::map<std::string, double> troupe_figures;
  run_patterns(rt, troupe::Options{}, bench::kMembers, 100, seconds, "", troupe_figures);
  run_patterns(rt, troupe::Options{}.process(true), bench::kCallers * 2, 4, seconds, "xproc_", troupe_figures);
  rt.shutdown();
  nlohmann::json j;
  for (auto& [k, v] : troupe_figures) j[k] = k.ends_with("_cpu_us") ? std::round(v * 100) / 100 : std::round(v);
  for (auto& [k, v] : bench::run_raw_caf(seconds)) j[k] = std::round(v);
  for (const char* k : {"1_1_actor_calls_sync", "1_1_actor_calls_async", "1_n_actor_calls_async",
                        "n_n_actor_calls_async", "actor_creation_per_s"}) {
    j[std::string("ratio_vs_raw_caf_") + k] = j[k].get<double>() / j[std::string("raw_caf_") + k].get<double>();
  }
  j["hardware_threads"] = std::thread::hardware_concurrency();
  std::cout << j.dump() << std::endl;
}
