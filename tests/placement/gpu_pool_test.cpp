// Fractional GPUs: exact sums, one device per fractional request, whole devices otherwise.
#include <random>

#include "placement_test_util.hpp"

using namespace troupe::placement;
using troupe::PlacementCode;
using namespace troupe::placement::test;

TEST_CASE("ten 0.1 GPU actors fill exactly one GPU and an eleventh does not fit") {
  Scheduler s;
  REQUIRE_OK(s.add_node(1, res("CPU=16,GPU=1")));
  for (ActorId a = 1; a <= 10; ++a) REQUIRE_OK(s.place_actor(actor(a, "GPU=0.1")));
  CHECK(s.node(1)->available.get(kGpu).units() == 0);
  CHECK(s.place_actor(actor(11, "GPU=0.1")).error().code == PlacementCode::Unavailable);
  CHECK(s.place_actor(actor(12, "GPU=0.0001")).error().code == PlacementCode::Unavailable);
  CHECK_OK(s.validate());
}

TEST_CASE("fractional GPU requests stack on one device and never straddle two") {
  Scheduler s;
  REQUIRE_OK(s.add_node(1, res("GPU=2")));
  auto a = s.place_actor(actor(1, "GPU=0.5"));
  auto b = s.place_actor(actor(2, "GPU=0.5"));
  REQUIRE_OK(a);
  REQUIRE_OK(b);
  CHECK(a->gpus.size() == 1);
  CHECK(a->gpus[0].index == b->gpus[0].index);  // best fit stacks fractions
  REQUIRE_OK(s.release_actor(1));
  REQUIRE_OK(s.release_actor(2));
  auto c = s.place_actor(actor(3, "GPU=0.7"));
  auto d = s.place_actor(actor(4, "GPU=0.7"));
  REQUIRE_OK(c);
  REQUIRE_OK(d);
  CHECK(c->gpus[0].index != d->gpus[0].index);
  // 0.6 GPU is free in total, but only as 0.3 + 0.3 on two devices.
  CHECK(s.node(1)->available.get(kGpu) == Quantity::from_double(0.6));
  CHECK(s.place_actor(actor(5, "GPU=0.6")).error().code == PlacementCode::Unavailable);
  CHECK(s.place_actor(actor(6, "GPU=0.3")).ok());
  CHECK_OK(s.validate());
}

TEST_CASE("whole GPU requests take whole free devices") {
  Scheduler s;
  REQUIRE_OK(s.add_node(1, res("GPU=4")));
  auto two = s.place_actor(actor(1, "GPU=2"));
  REQUIRE_OK(two);
  REQUIRE(two->gpus.size() == 2);
  for (const GpuShare& g : two->gpus) CHECK(g.amount == Quantity::whole(1));
  CHECK(two->gpus[0].index != two->gpus[1].index);
  REQUIRE_OK(s.release_actor(1));
  for (ActorId a = 2; a <= 5; ++a) REQUIRE_OK(s.place_actor(actor(a, "GPU=0.6")));  // one per device
  // 1.6 GPUs free in total, but no whole device: a 1-GPU request waits.
  CHECK(s.node(1)->available.get(kGpu) == Quantity::from_double(1.6));
  CHECK(s.place_actor(actor(6, "GPU=1")).error().code == PlacementCode::Unavailable);
  CHECK(s.place_actor(actor(7, "GPU=0.4")).ok());
  CHECK_OK(s.validate());
}

TEST_CASE("actors in a fractional-GPU bundle get slices of the bundle's device") {
  Scheduler s;
  REQUIRE_OK(s.add_node(1, res("CPU=4,GPU=2")));
  auto g = s.create_placement_group(spec({res("GPU=0.5"), res("GPU=0.5"), res("GPU=1")}, Strategy::kStrictPack));
  REQUIRE_OK(g);
  ActorRequest a = actor(1, "GPU=0.25");
  a.bundle = BundleRef{g->id, 0};
  auto p = s.place_actor(a);
  REQUIRE_OK(p);
  a.actor = 2;
  a.resources = res("GPU=0.5");
  CHECK(s.place_actor(a).error().code == PlacementCode::Unavailable);  // 0.25 left in bundle 0
  a.bundle = BundleRef{g->id, 2};
  a.resources = res("GPU=1");
  auto whole = s.place_actor(a);
  REQUIRE_OK(whole);
  CHECK(whole->gpus[0].index != p->gpus[0].index);
  CHECK_OK(s.validate());
}

TEST_CASE("random fractional GPU churn never overbooks a device (PG-2)") {
  std::mt19937_64 rng(99);
  const char* shapes[] = {"GPU=0.1", "GPU=0.25", "GPU=0.5", "GPU=0.3", "GPU=1", "GPU=2", "GPU=0.0001"};
  Scheduler s;
  for (NodeId n = 1; n <= 8; ++n) REQUIRE_OK(s.add_node(n, res("CPU=64,GPU=4")));
  std::vector<ActorId> live;
  for (ActorId a = 1; a <= 5000; ++a) {
    if (!live.empty() && rng() % 2) {
      const std::size_t i = rng() % live.size();
      REQUIRE_OK(s.release_actor(live[i]));
      live[i] = live.back();
      live.pop_back();
    } else if (auto p = s.place_actor(actor(a, shapes[a % 7])); p.ok()) {
      Quantity sum;
      for (const GpuShare& g : p->gpus) {
        sum += g.amount;
        CHECK(g.amount <= Quantity::whole(1));
      }
      CHECK(sum == res(shapes[a % 7]).get(kGpu));  // the slices add up to the request exactly
      live.push_back(a);
    }
    if (a % 250 == 0) REQUIRE_OK(s.validate());
  }
}
