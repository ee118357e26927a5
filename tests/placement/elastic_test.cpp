#include <doctest/doctest.h>

#include <random>

#include "troupe/placement/elastic.hpp"
#include "troupe/placement/simulator.hpp"

using namespace troupe::placement;

TEST_CASE("the elastic controller starts what a group lacks, stops what it has over its target") {
  CHECK(elastic_delta(ElasticDemand{1, 4, 1, 0}) == 3);
  CHECK(elastic_delta(ElasticDemand{1, 4, 1, 3}) == 0);   // three already waiting for room
  CHECK(elastic_delta(ElasticDemand{1, 2, 3, 1}) == -2);
}

TEST_CASE("freed room goes to the group furthest below its target first (the deficit rule)") {
  // Job A's group has 1 of 4, job B's 3 of 4: A first; B's tie with C (deficit 1) by its larger target.
  auto order = elastic_grow_order({{10, 4, 3, 1}, {20, 4, 1, 3}, {30, 2, 1, 1}, {40, 2, 2, 0}});
  CHECK(order == std::vector<std::uint64_t>{20, 10, 30});   // 40 is at its target
  CHECK(elastic_grow_order({{2, 3, 1, 0}, {1, 3, 1, 0}}) == std::vector<std::uint64_t>{1, 2});
  CHECK(elastic_grow_order({}).empty());
}

TEST_CASE("elastic_fill hands room out one member at a time, furthest below first, until nothing more fits") {
  std::vector<ElasticDemand> demands{{1, 4, 0, 0}, {2, 4, 2, 1}, {3, 1, 1, 0}};
  std::vector<std::uint64_t> order;
  int room = 5;
  const auto placed = elastic_fill(demands, [&](const ElasticDemand& d) {
    if (room == 0) return false;
    order.push_back(d.group);
    --room;
    return true;
  });
  CHECK(placed == 5);
  // 1 (deficit 4), 1 (3), 1 (2) and 2 (2: the lower id wins the tie), 1 (1) and 2 (1): group 3 is at its target.
  CHECK(order == std::vector<std::uint64_t>{1, 1, 1, 2, 1});
  CHECK(demands[0].live == 4);
  CHECK(demands[1].live == 3);
  CHECK(demands[1].starting == 0);   // its waiting member took the room
  // A group that cannot place drops out; the others still get room.
  std::vector<ElasticDemand> two{{1, 3, 0, 0}, {2, 2, 0, 0}};
  std::vector<std::uint64_t> got;
  CHECK(elastic_fill(two, [&](const ElasticDemand& d) {
          if (d.group == 1) return false;
          got.push_back(d.group);
          return true;
        }) == 2);
  CHECK(got == std::vector<std::uint64_t>{2, 2});
}

TEST_CASE("two jobs' elastic groups on the placement simulator: freed room goes to the group furthest below its target") {
  SimulatorOptions o;
  o.initial_nodes = 0;
  o.gpu_node_fraction = 0;
  o.zones = 1;
  o.cpu_node = Resources::must_parse("CPU=4");
  Simulator sim(o);
  const auto one = Resources::must_parse("CPU=1");
  sim.join();
  const auto a = sim.add_elastic_group(4, one);   // job A's rollout group
  sim.reconcile_elastic();
  const auto b = sim.add_elastic_group(4, one);   // job B's: no room yet
  sim.reconcile_elastic();
  auto size = [&](std::uint64_t g) { return sim.elastic_group(g)->members.size(); };
  REQUIRE(size(a) == 4);
  REQUIRE(size(b) == 0);
  sim.join();   // 4 more CPUs: B is 4 below, A at its target
  sim.reconcile_elastic();
  CHECK(size(a) == 4);
  CHECK(size(b) == 4);
  // Node 1 dies with A's four members: A is 4 below, B at its target. B's target drops to 2: the
  // room its two newest members free goes to A, the group furthest below.
  sim.die(1);
  CHECK(size(a) == 0);
  CHECK(sim.set_elastic_target(b, 2));
  sim.reconcile_elastic();
  CHECK(size(b) == 2);
  CHECK(size(a) == 2);
  CHECK(sim.set_elastic_target(b, 4));   // now A and B are both 2 below: the tie goes to the lower id
  sim.join();                            // 4 more CPUs: A, B, A, B
  sim.reconcile_elastic();
  CHECK(size(a) == 4);
  CHECK(size(b) == 4);
  CHECK(sim.stats().elastic_lost == 4);
  CHECK(sim.stats().elastic_stopped == 2);
}

TEST_CASE("under churn the simulator's elastic groups never pass their targets and leave no room a group below could use") {
  SimulatorOptions o;
  o.initial_nodes = 20;
  o.seed = 11;
  Simulator sim(o);
  std::mt19937_64 rng(5);
  std::vector<std::uint64_t> groups;
  for (int i = 0; i < 6; ++i) groups.push_back(sim.add_elastic_group(2 + i * 3, Resources::must_parse(i % 2 ? "CPU=2" : "CPU=1,GPU=0.5")));
  ChurnMix mix;
  for (int step = 0; step < 3000; ++step) {
    if (step % 50 == 0) sim.set_elastic_target(groups[rng() % groups.size()], std::int64_t(rng() % 30));
    sim.step(mix);
    if (step % 100 != 99) continue;
    for (auto id : groups) {
      const SimElasticGroup* g = sim.elastic_group(id);
      REQUIRE(g != nullptr);
      CHECK(std::int64_t(g->members.size()) <= g->target);
      if (std::int64_t(g->members.size()) < g->target) {   // below: not one more of its shape fits anywhere
        const ActorId probe = 1'000'000'000 + ActorId(step);
        const bool fits = sim.scheduler().place_actor(ActorRequest{probe, g->shape, std::nullopt, false, {}, std::nullopt}).ok();
        if (fits) (void)sim.scheduler().release_actor(probe);
        CHECK_FALSE(fits);
      }
    }
  }
  CHECK(sim.stats().elastic_started > 0);
  CHECK(sim.stats().elastic_lost > 0);
}
