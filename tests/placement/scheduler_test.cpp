#include <random>
#include <set>

#include "placement_test_util.hpp"

using namespace troupe::placement;
using troupe::PlacementCode;
using namespace troupe::placement::test;

namespace {

std::map<NodeId, int> actors_per_node(const Scheduler& s, ActorId first, ActorId last) {
  std::map<NodeId, int> out;
  for (ActorId a = first; a <= last; ++a)
    if (auto p = s.actor(a)) ++out[p->node];
  return out;
}

}  // namespace

TEST_CASE("the default policy packs a node to half, then moves on, then spreads (Ray's hybrid)") {
  Scheduler s;
  for (NodeId n = 1; n <= 4; ++n) REQUIRE_OK(s.add_node(n, res("CPU=8")));
  for (ActorId a = 1; a <= 4; ++a) REQUIRE_OK(s.place_actor(actor(a, "CPU=1")));
  CHECK(actors_per_node(s, 1, 4).size() == 1);  // packed: one node at 50%
  for (ActorId a = 5; a <= 16; ++a) REQUIRE_OK(s.place_actor(actor(a, "CPU=1")));
  auto per_node = actors_per_node(s, 1, 16);
  REQUIRE(per_node.size() == 4);
  for (auto [node, count] : per_node) CHECK(count == 4);  // every node filled to the threshold
  for (ActorId a = 17; a <= 20; ++a) REQUIRE_OK(s.place_actor(actor(a, "CPU=1")));
  for (auto [node, count] : actors_per_node(s, 1, 20)) CHECK(count == 5);  // then spread evenly
  CHECK_OK(s.validate());
}

TEST_CASE("requests without GPUs stay off GPU nodes while a CPU node fits") {
  Scheduler s;
  REQUIRE_OK(s.add_node(1, res("CPU=8,GPU=8")));
  REQUIRE_OK(s.add_node(2, res("CPU=4")));
  for (ActorId a = 1; a <= 4; ++a) CHECK(s.place_actor(actor(a, "CPU=1"))->node == 2);
  CHECK(s.place_actor(actor(5, "CPU=1"))->node == 1);  // CPU node full: the GPU node takes it
  CHECK(s.place_actor(actor(6, "CPU=1,GPU=1"))->node == 1);
  CHECK_OK(s.validate());
}

TEST_CASE("label selectors constrain the node and say so when nothing matches") {
  Scheduler s;
  REQUIRE_OK(s.add_node(1, res("CPU=8"), {{"zone", "a"}}));
  REQUIRE_OK(s.add_node(2, res("CPU=8"), {{"zone", "b"}, {"ssd", "yes"}}));
  ActorRequest r = actor(1, "CPU=1");
  r.selector = LabelSelector::equals("zone", "b");
  CHECK(s.place_actor(r)->node == 2);
  r.actor = 2;
  r.selector = LabelSelector().not_in("zone", {"b"});
  CHECK(s.place_actor(r)->node == 1);
  r.actor = 3;
  r.selector = LabelSelector().exists("ssd");
  CHECK(s.place_actor(r)->node == 2);
  r.actor = 4;
  r.selector = LabelSelector::equals("zone", "c");
  auto none = s.place_actor(r);
  REQUIRE_FALSE(none.ok());
  CHECK(none.error().code == PlacementCode::Infeasible);
  CHECK(none.error().message.find("zone in (c)") != std::string::npos);
}

TEST_CASE("impossible actor requests give clear errors") {
  Scheduler s;
  REQUIRE_OK(s.add_node(1, res("CPU=4,GPU=1")));
  auto huge = s.place_actor(actor(1, "CPU=64"));
  CHECK(huge.error().code == PlacementCode::Infeasible);
  CHECK(huge.error().message.find("CPU=64") != std::string::npos);
  CHECK(s.place_actor(actor(2, "GPU=1.5")).error().code == PlacementCode::InvalidArgument);
  CHECK(s.place_actor(actor(3, "TPU=1")).error().code == PlacementCode::Infeasible);
  REQUIRE_OK(s.place_actor(actor(4, "CPU=4")));
  CHECK(s.place_actor(actor(5, "CPU=1")).error().code == PlacementCode::Unavailable);
  CHECK(s.place_actor(actor(4, "CPU=0")).error().code == PlacementCode::AlreadyExists);
  ActorRequest colocated = actor(6, "CPU=0");
  colocated.colocate = true;
  CHECK(s.place_actor(colocated).error().code == PlacementCode::InvalidArgument);
  CHECK(s.release_actor(99).error().code == PlacementCode::NotFound);
  CHECK_OK(s.validate());
}

TEST_CASE("a dead node stays dead and its id cannot rejoin (FT-3)") {
  Scheduler s;
  REQUIRE_OK(s.add_node(1, res("CPU=4")));
  CHECK(s.add_node(1, res("CPU=4")).error().code == PlacementCode::AlreadyExists);
  REQUIRE_OK(s.place_actor(actor(1, "CPU=1")));
  auto loss = s.mark_dead(1);
  REQUIRE_OK(loss);
  CHECK(loss->lost_actors == std::vector<ActorId>{1});
  CHECK_FALSE(s.actor(1).has_value());
  CHECK(s.add_node(1, res("CPU=4")).error().code == PlacementCode::AlreadyExists);
  CHECK(s.mark_dead(1).error().code == PlacementCode::FailedPrecondition);
  CHECK(s.node(1)->state == NodeState::kDead);
  CHECK_OK(s.validate());
}

TEST_CASE("a draining node keeps its actors and takes no new ones") {
  Scheduler s;
  REQUIRE_OK(s.add_node(1, res("CPU=4")));
  REQUIRE_OK(s.add_node(2, res("CPU=4")));
  auto first = s.place_actor(actor(1, "CPU=1"));
  REQUIRE_OK(first);
  REQUIRE_OK(s.drain_node(first->node));
  for (ActorId a = 2; a <= 5; ++a) CHECK(s.place_actor(actor(a, "CPU=1"))->node != first->node);
  CHECK(s.actor(1)->node == first->node);
  CHECK(s.place_actor(actor(6, "CPU=1")).error().code == PlacementCode::Unavailable);
  REQUIRE_OK(s.release_actor(1));
  CHECK_OK(s.validate());
}

TEST_CASE("capacity is never exceeded and release restores availability exactly (PG-2)") {
  std::mt19937_64 rng(2024);
  const char* shapes[] = {"CPU=1", "CPU=0.3", "CPU=2,GPU=1", "GPU=0.25", "CPU=0.5,memory=3G", "CPU=1,custom=0.7"};
  for (int trial = 0; trial < 40; ++trial) {
    Scheduler s;
    const int nodes = 1 + static_cast<int>(rng() % 12);
    for (int n = 1; n <= nodes; ++n)
      REQUIRE_OK(s.add_node(n, res(rng() % 2 ? "CPU=8,GPU=2,memory=16G,custom=2" : "CPU=3,memory=8G")));
    const auto before = availability(s);
    std::vector<ActorId> live;
    for (ActorId a = 1; a <= 400; ++a) {
      if (!live.empty() && rng() % 3 == 0) {
        const std::size_t i = rng() % live.size();
        REQUIRE_OK(s.release_actor(live[i]));
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
        continue;
      }
      auto p = s.place_actor(actor(a, shapes[rng() % 6]));
      if (p.ok()) live.push_back(a);
      else CHECK((p.error().code == PlacementCode::Unavailable || p.error().code == PlacementCode::Infeasible));
      if (a % 50 == 0) REQUIRE_OK(s.validate());
    }
    for (ActorId a : live) REQUIRE_OK(s.release_actor(a));
    CHECK(availability(s) == before);
  }
}

TEST_CASE("ten thousand nodes take fifty thousand actors without a failure") {
  Scheduler s;
  for (NodeId n = 1; n <= 10'000; ++n) REQUIRE_OK(s.add_node(n, res(n % 4 ? "CPU=32" : "CPU=64,GPU=8")));
  int failed = 0;
  for (ActorId a = 1; a <= 50'000; ++a)
    failed += !s.place_actor(actor(a, a % 5 ? "CPU=1" : "CPU=1,GPU=0.5")).ok();
  CHECK(failed == 0);
  CHECK(s.actor_count() == 50'000);
  CHECK_OK(s.validate());
}

TEST_CASE("a label shared by many nodes is honoured through the utilization index") {
  Scheduler s;
  for (NodeId n = 1; n <= 400; ++n)
    REQUIRE_OK(s.add_node(n, res("CPU=4"), {{"zone", n % 2 ? "a" : "b"}}));  // 200 per zone
  for (ActorId a = 1; a <= 800; ++a) {
    ActorRequest r = actor(a, "CPU=1");
    r.selector = LabelSelector::equals("zone", "a");
    auto p = s.place_actor(r);
    REQUIRE_OK(p);
    CHECK(p->node % 2 == 1);
  }
  ActorRequest full = actor(801, "CPU=1");
  full.selector = LabelSelector::equals("zone", "a");
  CHECK(s.place_actor(full).error().code == PlacementCode::Unavailable);  // zone a is full, b is not used
  CHECK_OK(s.validate());
}

TEST_CASE("an actor pinned to a node goes there or fails saying why (hard node affinity)") {
  Scheduler s;
  REQUIRE_OK(s.add_node(1, res("CPU=4")));
  REQUIRE_OK(s.add_node(2, res("CPU=4")));
  for (ActorId a = 1; a <= 3; ++a) {   // the hybrid policy would pack these onto one node
    ActorRequest r = actor(a, "CPU=1");
    r.node = 2;
    auto p = s.place_actor(r);
    REQUIRE_OK(p);
    CHECK(p->node == 2);
  }
  ActorRequest too_big = actor(4, "CPU=2");
  too_big.node = 2;
  CHECK(s.place_actor(too_big).error().code == PlacementCode::Unavailable);
  ActorRequest nowhere = actor(5, "CPU=1");
  nowhere.node = 9;
  CHECK(s.place_actor(nowhere).error().code == PlacementCode::NotFound);
  REQUIRE_OK(s.mark_dead(1));
  ActorRequest dead = actor(6, "CPU=1");
  dead.node = 1;
  CHECK(s.place_actor(dead).error().code == PlacementCode::NotFound);
  CHECK(s.node(2)->available == res("CPU=1"));
  CHECK_OK(s.validate());
}
