// Placement benchmark. Prints progress to stderr and one JSON object as the last stdout line.
//
//   pg_create_remove_per_s            create + remove of a 4-bundle group on 1,000 nodes, the
//                                     strategies in rotation, against a cluster with ~35% of
//                                     its GPUs busy
//   actor_placements_per_s_{1k,10k}_nodes
//                                     steady state on the simulator's nodes (half GPU, half CPU
//                                     shapes) kept ~60% GPU-busy: each iteration places one actor
//                                     (mixed CPU / fractional GPU / whole GPU / zone-pinned) and
//                                     releases a random one; the rate counts placements, with
//                                     the releases' cost included
//   balance_*_ratio                   makespan / max(sum/k, largest item) for lognormal token
//                                     lengths (sigma 1, 4,096 items, 16 members), mean of 20 draws
#include <chrono>
#include <cmath>
#include <iostream>
#include <random>

#include <nlohmann/json.hpp>

#include "troupe/placement/balancer.hpp"
#include "troupe/placement/simulator.hpp"

using namespace troupe::placement;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

double pg_create_remove_per_s() {
  SimulatorOptions options;
  options.initial_nodes = 1000;
  Simulator sim(options);
  for (int i = 0; i < 4000; ++i) sim.place_random_actor();  // background load: ~35% of GPUs
  Scheduler& s = sim.scheduler();
  const Resources bundle = Resources::must_parse("CPU=1,GPU=1");
  PlacementGroupSpec specs[4];
  for (int k = 0; k < 4; ++k) {
    specs[k].bundles.assign(4, bundle);
    specs[k].strategy = static_cast<Strategy>(k);
    specs[k].wait_if_unplaced = false;
  }
  std::uint64_t done = 0;
  const auto start = Clock::now();
  while (seconds_since(start) < 1.5) {
    for (int i = 0; i < 1000; ++i) {
      auto g = s.create_placement_group(specs[done % 4]);
      if (!g.ok()) throw std::runtime_error(g.error().to_string());
      if (!s.remove_placement_group(g->id).ok()) throw std::runtime_error("remove failed");
      ++done;
    }
  }
  if (!s.validate().ok()) throw std::runtime_error(s.validate().error().to_string());
  return static_cast<double>(done) / seconds_since(start);
}

double actor_placements_per_s(std::size_t nodes) {
  SimulatorOptions options;
  options.initial_nodes = nodes;
  options.seed = 2;
  Simulator sim(options);
  // Fill to ~60% of the GPUs: 7 actors per node with the simulator's request mix.
  const std::size_t target = nodes * 7;
  while (sim.actors().size() < target && sim.place_random_actor()) {}
  std::uint64_t placed = 0, attempts = 0;
  const auto start = Clock::now();
  while (seconds_since(start) < 2.0) {
    for (int i = 0; i < 1000; ++i) {
      sim.release_random_actor();
      placed += sim.place_random_actor();
      ++attempts;
    }
  }
  const double rate = static_cast<double>(placed) / seconds_since(start);
  std::cerr << nodes << " nodes: " << placed << " of " << attempts << " placements succeeded, "
            << sim.actors().size() << " actors live\n";
  if (!sim.scheduler().validate().ok()) throw std::runtime_error(sim.scheduler().validate().error().to_string());
  return rate;
}

struct BalanceRatios {
  double kk = 0, lpt = 0, round_robin = 0, kk_us = 0;
};

BalanceRatios balance_ratios() {
  constexpr int kDraws = 20;
  constexpr std::size_t kItems = 4096, kMembers = 16;
  std::mt19937_64 rng(31);
  std::lognormal_distribution<double> tokens(std::log(512.0), 1.0);
  BalanceRatios out;
  for (int d = 0; d < kDraws; ++d) {
    std::vector<std::int64_t> costs(kItems);
    for (auto& c : costs) c = std::max<std::int64_t>(1, std::llround(tokens(rng)));
    const double lb = makespan_lower_bound(costs, kMembers);
    const auto start = Clock::now();
    const Partition kk = partition_kk(costs, kMembers);
    out.kk_us += seconds_since(start) * 1e6 / kDraws;
    out.kk += static_cast<double>(kk.makespan()) / lb / kDraws;
    out.lpt += static_cast<double>(partition_lpt(costs, kMembers).makespan()) / lb / kDraws;
    out.round_robin += static_cast<double>(partition_round_robin(costs, kMembers).makespan()) / lb / kDraws;
  }
  return out;
}

}  // namespace

int main() {
  nlohmann::json out;
  out["pg_create_remove_per_s"] = std::round(pg_create_remove_per_s());
  out["actor_placements_per_s_1k_nodes"] = std::round(actor_placements_per_s(1000));
  out["actor_placements_per_s_10k_nodes"] = std::round(actor_placements_per_s(10'000));
  const BalanceRatios b = balance_ratios();
  out["balance_kk_ratio"] = std::round(b.kk * 1e5) / 1e5;
  out["balance_lpt_ratio"] = std::round(b.lpt * 1e5) / 1e5;
  out["balance_round_robin_ratio"] = std::round(b.round_robin * 1e5) / 1e5;
  out["balance_kk_us_4096x16"] = std::round(b.kk_us);
  std::cout << out.dump() << std::endl;
  return 0;
}
