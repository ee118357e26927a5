#include "placement_test_util.hpp"
#include "troupe/placement/simulator.hpp"

using namespace troupe::placement;

TEST_CASE("invariants hold under churn: joins, leaves, deaths, actors and groups (PG-1, PG-2)") {
  SimulatorOptions options;
  options.seed = 123;
  options.initial_nodes = 200;
  Simulator sim(options);
  for (int step = 1; step <= 20'000; ++step) {
    sim.step();
    if (step % 500 == 0) REQUIRE_OK(sim.scheduler().validate());
  }
  const SimStats& st = sim.stats();
  CHECK(st.deaths > 0);
  CHECK(st.leaves > 0);
  CHECK(st.placed > 1000);
  CHECK(st.groups_created > 0);
  CHECK(sim.scheduler().actor_count() == sim.actors().size());
}

TEST_CASE("the simulator is deterministic for a seed") {
  auto run = [] {
    SimulatorOptions options;
    options.seed = 5;
    options.initial_nodes = 50;
    Simulator sim(options);
    for (int i = 0; i < 3000; ++i) sim.step();
    return std::tuple(sim.stats().placed, sim.stats().lost_actors, sim.stats().groups_created, sim.alive_nodes());
  };
  CHECK(run() == run());
}

TEST_CASE("a heavy churn of deaths at two thousand nodes keeps the books exact") {
  SimulatorOptions options;
  options.seed = 77;
  options.initial_nodes = 2000;
  Simulator sim(options);
  for (int i = 0; i < 20'000; ++i) sim.place_random_actor();
  for (int i = 0; i < 100; ++i) sim.create_random_group();
  REQUIRE_OK(sim.scheduler().validate());
  ChurnMix deadly;
  deadly.die = 20;
  deadly.join = 20;
  for (int step = 1; step <= 5000; ++step) {
    sim.step(deadly);
    if (step % 1000 == 0) REQUIRE_OK(sim.scheduler().validate());
  }
  CHECK(sim.stats().lost_actors > 0);
  // Every group is whole or waiting; none is CREATED with a missing bundle (PG-1).
  for (PlacementGroupId id : sim.scheduler().group_ids()) {
    auto g = sim.scheduler().group(id);
    if (g->state != GroupState::kCreated) continue;
    for (const auto& n : g->bundle_nodes) CHECK(n.has_value());
  }
}
