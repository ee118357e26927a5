// build/bench/actor_calls: Ray's actor microbenchmarks on troupe, in-process, beside the same
// patterns on bare CAF. Prints one JSON object (calls or actors per second) on its last line.
//   --seconds S   wall time per case (default 2)
#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
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

std::map<std::string, double> run_troupe(double seconds) {
  auto rt = troupe::Runtime::create();
  std::map<std::string, double> out;
  auto group = rt.spawn_group<Echo>(bench::kMembers, troupe::Options{});
  const auto& members = group.members();
  out["1_1_actor_calls_sync"] = bench::rate(seconds, 200, [&] {
    for (int i = 0; i < 200; ++i) (void)members[0].call(&Echo::echo, i).get();
  });
  out["1_1_actor_calls_async"] = bench::rate(seconds, kBatch, [&] { async_calls({members[0]}, kBatch); });
  out["1_n_actor_calls_async"] = bench::rate(seconds, kBatch, [&] { async_calls(members, kBatch); });
  out["n_n_actor_calls_async"] = bench::rate(seconds, long(bench::kCallers) * kBatch, [&] {
    std::vector<std::thread> ts;
    for (int c = 0; c < bench::kCallers; ++c) ts.emplace_back([&] { async_calls(members, kBatch); });
    for (auto& t : ts) t.join();
  });
  for (auto& m : members) rt.kill(m);
  out["actor_creation_per_s"] = bench::rate(seconds, 100, [&] {
    auto g = rt.spawn_group<Echo>(100, troupe::Options{});
    (void)g.call_all(&Echo::echo, 1).get();
    for (auto& m : g) rt.kill(m);
  });
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 2.0;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--seconds") == 0) seconds = std::atof(argv[i + 1]);
  }
  if (seconds <= 0) {
    std::fprintf(stderr, "actor_calls: --seconds must be positive\n");
    return 2;
  }
  nlohmann::json j;
  for (auto& [k, v] : run_troupe(seconds)) j[k] = std::round(v);
  for (auto& [k, v] : bench::run_raw_caf(seconds)) j[k] = std::round(v);
  for (const char* k : {"1_1_actor_calls_sync", "1_1_actor_calls_async", "1_n_actor_calls_async",
                        "n_n_actor_calls_async", "actor_creation_per_s"}) {
    j[std::string("ratio_vs_raw_caf_") + k] = j[k].get<double>() / j[std::string("raw_caf_") + k].get<double>();
  }
  j["hardware_threads"] = std::thread::hardware_concurrency();
  std::cout << j.dump() << std::endl;
}
