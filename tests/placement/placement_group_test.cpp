#include <algorithm>
#include <random>
#include <set>

#include "placement_test_util.hpp"

using namespace troupe::placement;
using troupe::PlacementCode;
using namespace troupe::placement::test;

namespace {

const char* kNodeShapes[] = {"CPU=4,GPU=2", "CPU=8", "CPU=16,GPU=4", "CPU=2,GPU=1", "CPU=6,GPU=8"};
const char* kBundleShapes[] = {"CPU=1", "CPU=2,GPU=1", "GPU=2", "CPU=4", "CPU=1,GPU=1", "CPU=3"};

struct RandomCase {
  std::vector<Resources> nodes;
  std::vector<Resources> bundles;
  Strategy strategy;
};

RandomCase random_case(std::mt19937_64& rng, int max_nodes, int max_bundles) {
  RandomCase c;
  const int n = 1 + static_cast<int>(rng() % max_nodes);
  for (int i = 0; i < n; ++i) c.nodes.push_back(res(kNodeShapes[rng() % 5]));
  const int b = 1 + static_cast<int>(rng() % max_bundles);
  for (int i = 0; i < b; ++i) c.bundles.push_back(res(kBundleShapes[rng() % 6]));
  c.strategy = static_cast<Strategy>(rng() % 4);
  return c;
}

void add_nodes(Scheduler& s, const std::vector<Resources>& nodes) {
  for (std::size_t i = 0; i < nodes.size(); ++i) REQUIRE_OK(s.add_node(i + 1, nodes[i]));
}

// Brute force over every bundle->node assignment on an empty cluster (whole GPUs only, so the
// aggregate check is exact). Returns whether one satisfies the strategy's hard constraint.
bool feasible_by_brute_force(const RandomCase& c) {
  const std::size_t n = c.nodes.size(), b = c.bundles.size();
  std::vector<std::size_t> assign(b, 0);
  while (true) {
    std::vector<Resources> used(n);
    std::set<std::size_t> distinct;
    for (std::size_t i = 0; i < b; ++i) used[assign[i]] += c.bundles[i], distinct.insert(assign[i]);
    bool ok = true;
    for (std::size_t k = 0; k < n; ++k) ok = ok && used[k].fits_in(c.nodes[k]);
    if (c.strategy == Strategy::kStrictPack) ok = ok && distinct.size() == 1;
    if (c.strategy == Strategy::kStrictSpread) ok = ok && distinct.size() == b;
    if (ok) return true;
    std::size_t i = 0;
    while (i < b && ++assign[i] == n) assign[i++] = 0;
    if (i == b) return false;
  }
}

std::set<NodeId> nodes_of(const GroupView& g) {
  std::set<NodeId> out;
  for (const auto& n : g.bundle_nodes) out.insert(*n);
  return out;
}

}  // namespace

TEST_CASE("placement groups are all or nothing and honour their strategy on random clusters (PG-1, PG-2)") {
  std::mt19937_64 rng(42);
  for (int trial = 0; trial < 2000; ++trial) {
    const RandomCase c = random_case(rng, 8, 6);
    Scheduler s;
    add_nodes(s, c.nodes);
    // Some background load, so placements meet partly used nodes.
    for (ActorId a = 1; a <= rng() % 6; ++a) (void)s.place_actor(actor(a, "CPU=1"));
    const auto before = availability(s);
    auto r = s.create_placement_group(spec(c.bundles, c.strategy));
    REQUIRE_OK(s.validate());
    if (!r.ok()) {
      CHECK(availability(s) == before);  // nothing reserved: not even one bundle
      CHECK(s.group_ids().empty());
      CHECK((r.error().code == PlacementCode::Infeasible || r.error().code == PlacementCode::Unavailable));
      continue;
    }
    const GroupView g = *s.group(r->id);
    REQUIRE(g.state == GroupState::kCreated);
    const auto nodes = nodes_of(g);
    if (c.strategy == Strategy::kStrictSpread) CHECK(nodes.size() == c.bundles.size());
    if (c.strategy == Strategy::kStrictPack) CHECK(nodes.size() == 1);
    auto killed = s.remove_placement_group(r->id);
    REQUIRE_OK(killed);
    CHECK(killed->empty());
    CHECK(availability(s) == before);  // removal restores availability exactly
  }
}

TEST_CASE("STRICT_SPREAD never puts two bundles on one node and succeeds exactly when brute force can") {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 1500; ++trial) {
    RandomCase c = random_case(rng, 6, 5);
    c.strategy = Strategy::kStrictSpread;
    Scheduler s;
    add_nodes(s, c.nodes);
    auto r = s.create_placement_group(spec(c.bundles, c.strategy));
    CHECK(r.ok() == feasible_by_brute_force(c));
    if (r.ok()) CHECK(nodes_of(*s.group(r->id)).size() == c.bundles.size());
    else CHECK(r.error().code == PlacementCode::Infeasible);  // empty cluster: never merely busy
  }
}

TEST_CASE("STRICT_PACK puts every bundle on one node and succeeds exactly when brute force can") {
  std::mt19937_64 rng(8);
  for (int trial = 0; trial < 1500; ++trial) {
    RandomCase c = random_case(rng, 6, 5);
    c.strategy = Strategy::kStrictPack;
    Scheduler s;
    add_nodes(s, c.nodes);
    auto r = s.create_placement_group(spec(c.bundles, c.strategy));
    CHECK(r.ok() == feasible_by_brute_force(c));
    if (r.ok()) CHECK(nodes_of(*s.group(r->id)).size() == 1);
  }
}

TEST_CASE("PACK uses as few nodes as it can and SPREAD as many") {
  Scheduler s;
  for (NodeId n = 1; n <= 4; ++n) REQUIRE_OK(s.add_node(n, res("CPU=8")));
  auto pack = s.create_placement_group(spec({res("CPU=4"), res("CPU=4"), res("CPU=4")}, Strategy::kPack));
  REQUIRE_OK(pack);
  CHECK(nodes_of(*s.group(pack->id)).size() == 2);  // 12 CPUs over 8-CPU nodes
  auto spread = s.create_placement_group(spec({res("CPU=1"), res("CPU=1"), res("CPU=1")}, Strategy::kSpread));
  REQUIRE_OK(spread);
  CHECK(nodes_of(*s.group(spread->id)).size() == 3);
  auto crowded = s.create_placement_group(spec(std::vector<Resources>(6, res("CPU=1")), Strategy::kSpread));
  REQUIRE_OK(crowded);  // SPREAD may share nodes when it must
  CHECK_OK(s.validate());
}

TEST_CASE("an infeasible group is reported as infeasible and can wait as pending until a node joins") {
  Scheduler s;
  REQUIRE_OK(s.add_node(1, res("CPU=8,GPU=4")));
  auto rejected = s.create_placement_group(spec({res("GPU=4"), res("GPU=4")}, Strategy::kStrictPack));
  REQUIRE_FALSE(rejected.ok());
  CHECK(rejected.error().code == PlacementCode::Infeasible);
  CHECK(rejected.error().message.find("GPU=8") != std::string::npos);
  CHECK(s.group_ids().empty());

  auto waiting = s.create_placement_group(spec({res("GPU=4"), res("GPU=4")}, Strategy::kStrictPack, true));
  REQUIRE_OK(waiting);
  CHECK(waiting->state == GroupState::kPending);
  CHECK(waiting->reason.error().code == PlacementCode::Infeasible);
  CHECK(s.node(1)->available == res("CPU=8,GPU=4"));  // pending holds nothing (PG-1)
  CHECK(s.take_ready_groups().empty());
  REQUIRE_OK(s.add_node(2, res("CPU=8,GPU=8")));
  CHECK(s.take_ready_groups() == std::vector<PlacementGroupId>{waiting->id});
  CHECK(s.group(waiting->id)->state == GroupState::kCreated);
  CHECK(nodes_of(*s.group(waiting->id)) == std::set<NodeId>{2});
  CHECK_OK(s.validate());
}

TEST_CASE("a group that only lacks free room is unavailable and is placed when room is released") {
  Scheduler s;
  REQUIRE_OK(s.add_node(1, res("CPU=4")));
  REQUIRE_OK(s.place_actor(actor(1, "CPU=3")));
  auto g = s.create_placement_group(spec({res("CPU=2")}, Strategy::kPack, true));
  REQUIRE_OK(g);
  CHECK(g->reason.error().code == PlacementCode::Unavailable);
  REQUIRE_OK(s.release_actor(1));
  CHECK(s.take_ready_groups() == std::vector<PlacementGroupId>{g->id});
  CHECK_OK(s.validate());
}

TEST_CASE("removing a group releases everything and returns its actors to kill") {
  Scheduler s;
  REQUIRE_OK(s.add_node(1, res("CPU=8,GPU=2")));
  const auto before = availability(s);
  auto g = s.create_placement_group(spec({res("CPU=2,GPU=1"), res("CPU=2,GPU=1")}, Strategy::kPack));
  REQUIRE_OK(g);
  ActorRequest a = actor(10, "CPU=1,GPU=0.5");
  a.bundle = BundleRef{g->id, 0};
  REQUIRE_OK(s.place_actor(a));
  a.actor = 11;
  a.bundle = BundleRef{g->id, -1};
  REQUIRE_OK(s.place_actor(a));
  REQUIRE_OK(s.place_actor(actor(12, "CPU=1")));  // outside the group: survives
  auto killed = s.remove_placement_group(g->id);
  REQUIRE_OK(killed);
  std::sort(killed->begin(), killed->end());
  CHECK(*killed == std::vector<ActorId>{10, 11});
  CHECK_FALSE(s.actor(10).has_value());
  CHECK(s.actor(12).has_value());
  REQUIRE_OK(s.release_actor(12));
  CHECK(availability(s) == before);
  CHECK(s.remove_placement_group(g->id).error().code == PlacementCode::NotFound);
}

TEST_CASE("colocated actors of one bundle share one worker process, others get their own") {
  Scheduler s;
  REQUIRE_OK(s.add_node(1, res("CPU=8,GPU=1")));
  auto g = s.create_placement_group(spec({res("CPU=2,GPU=1"), res("CPU=2")}, Strategy::kStrictPack));
  REQUIRE_OK(g);
  auto place = [&](ActorId id, int bundle, bool colocate, const char* r) {
    ActorRequest a = actor(id, r);
    a.bundle = BundleRef{g->id, bundle};
    a.colocate = colocate;
    return s.place_actor(a);
  };
  auto trainer = place(1, 0, true, "CPU=1,GPU=0.5");
  auto rollout = place(2, 0, true, "CPU=1,GPU=0.5");
  auto other = place(3, 1, true, "CPU=1");
  auto loner = place(4, 1, false, "CPU=1");
  REQUIRE_OK(trainer);
  REQUIRE_OK(rollout);
  CHECK(trainer->worker == rollout->worker);
  CHECK(trainer->gpus.front().index == rollout->gpus.front().index);  // same device, hot swap by pointer
  CHECK(other->worker != trainer->worker);
  CHECK(loner->worker != other->worker);
  CHECK(place(5, 0, true, "CPU=1").error().code == PlacementCode::Unavailable);  // bundle 0 full
  CHECK(place(6, 0, true, "GPU=1.5").error().code == PlacementCode::InvalidArgument);
  CHECK(place(9, 0, true, "GPU=2").error().code == PlacementCode::Infeasible);
  CHECK(place(7, 5, true, "CPU=1").error().code == PlacementCode::InvalidArgument);
  CHECK(place(8, 1, true, "CPU=3").error().code == PlacementCode::Infeasible);  // more than the bundle holds
  CHECK_OK(s.validate());
}

TEST_CASE("node death re-reserves its bundles elsewhere and keeps the survivors in place") {
  Scheduler s;
  for (NodeId n = 1; n <= 3; ++n) REQUIRE_OK(s.add_node(n, res("CPU=4,GPU=1")));
  auto g = s.create_placement_group(spec({res("GPU=1"), res("GPU=1")}, Strategy::kStrictSpread));
  REQUIRE_OK(g);
  const auto at_start = *s.group(g->id);
  for (int b = 0; b < 2; ++b) {
    ActorRequest a = actor(100 + b, "GPU=1");
    a.bundle = BundleRef{g->id, b};
    REQUIRE_OK(s.place_actor(a));
  }
  const NodeId dead = *at_start.bundle_nodes[0];
  auto loss = s.mark_dead(dead);
  REQUIRE_OK(loss);
  CHECK(loss->lost_actors == std::vector<ActorId>{100});
  CHECK(loss->re_reserved == std::vector<PlacementGroupId>{g->id});
  const auto after = *s.group(g->id);
  CHECK(after.state == GroupState::kCreated);
  CHECK(after.bundle_nodes[1] == at_start.bundle_nodes[1]);   // survivor untouched, its actor alive
  CHECK(s.actor(101).has_value());
  CHECK(*after.bundle_nodes[0] != dead);
  CHECK(after.bundle_nodes[0] != after.bundle_nodes[1]);      // still STRICT_SPREAD

  // No room left: the lost bundle waits (RESCHEDULING) and goes first when a node joins.
  auto loss2 = s.mark_dead(*after.bundle_nodes[0]);
  REQUIRE_OK(loss2);
  CHECK(loss2->rescheduling == std::vector<PlacementGroupId>{g->id});
  CHECK(s.group(g->id)->state == GroupState::kRescheduling);
  auto rival = s.create_placement_group(spec({res("GPU=1")}, Strategy::kPack, true));
  REQUIRE_OK(rival);
  CHECK(rival->state == GroupState::kPending);
  REQUIRE_OK(s.add_node(4, res("CPU=4,GPU=1")));
  CHECK(s.take_ready_groups() == std::vector<PlacementGroupId>{g->id});  // re-reservation first
  CHECK(s.group(rival->id)->state == GroupState::kPending);
  CHECK_OK(s.validate());
}

TEST_CASE("STRICT_PACK groups move whole when their node dies") {
  Scheduler s;
  REQUIRE_OK(s.add_node(1, res("CPU=8")));
  REQUIRE_OK(s.add_node(2, res("CPU=8")));
  auto g = s.create_placement_group(spec({res("CPU=3"), res("CPU=3")}, Strategy::kStrictPack));
  REQUIRE_OK(g);
  const NodeId first = *s.group(g->id)->bundle_nodes[0];
  REQUIRE_OK(s.mark_dead(first));
  CHECK(nodes_of(*s.group(g->id)) == std::set<NodeId>{first == 1 ? NodeId{2} : NodeId{1}});
  CHECK_OK(s.validate());
}

TEST_CASE("malformed placement group specs are rejected with clear errors") {
  Scheduler s;
  REQUIRE_OK(s.add_node(1, res("CPU=8")));
  CHECK(s.create_placement_group(spec({}, Strategy::kPack)).error().code == PlacementCode::InvalidArgument);
  auto empty = s.create_placement_group(spec({res("CPU=1"), res("")}, Strategy::kPack));
  CHECK(empty.error().message.find("bundle 1") != std::string::npos);
  CHECK(s.create_placement_group(spec({res("GPU=1.5")}, Strategy::kPack)).error().code == PlacementCode::InvalidArgument);
  ActorRequest a = actor(1, "CPU=1");
  a.bundle = BundleRef{77, 0};
  CHECK(s.place_actor(a).error().code == PlacementCode::NotFound);
}

TEST_CASE("actors cannot use a pending group's bundles") {
  Scheduler s;
  REQUIRE_OK(s.add_node(1, res("CPU=2")));
  auto g = s.create_placement_group(spec({res("CPU=4")}, Strategy::kPack, true));
  REQUIRE_OK(g);
  ActorRequest a = actor(1, "CPU=1");
  a.bundle = BundleRef{g->id, 0};
  auto p = s.place_actor(a);
  CHECK(p.error().code == PlacementCode::FailedPrecondition);
  CHECK(p.error().message.find("PENDING") != std::string::npos);
}

TEST_CASE("a restored group keeps its id and its bundles' nodes, and what cannot be restored waits") {
  Scheduler s;
  for (NodeId n = 1; n <= 3; ++n) REQUIRE_OK(s.add_node(n, res("CPU=4")));
  // Recorded: bundle 0 on node 3, bundle 1 on node 1 (not where PACK would put them now).
  auto g = s.restore_placement_group(7, spec({res("CPU=2"), res("CPU=2")}, Strategy::kSpread),
                                     {NodeId(3), NodeId(1)});
  REQUIRE_OK(g);
  CHECK(g->id == 7);
  CHECK(g->state == GroupState::kCreated);
  CHECK(s.group(7)->bundle_nodes == std::vector<std::optional<NodeId>>{NodeId(3), NodeId(1)});
  CHECK(s.node(3)->available == res("CPU=2"));
  // Its actors can be pinned back to the bundle on their node.
  ActorRequest a = actor(100, "CPU=1");
  a.bundle = BundleRef{7, -1};
  a.node = 1;
  auto placed = s.place_actor(a);
  REQUIRE_OK(placed);
  CHECK(placed->bundle->index == 1);
  CHECK(s.restore_placement_group(7, spec({res("CPU=1")}, Strategy::kPack), {std::nullopt}).error().code ==
        PlacementCode::AlreadyExists);
  CHECK(s.restore_placement_group(8, spec({res("CPU=1")}, Strategy::kPack), {}).error().code ==
        PlacementCode::InvalidArgument);
  // New groups get ids above the restored one.
  auto next = s.create_placement_group(spec({res("CPU=1")}, Strategy::kPack));
  REQUIRE_OK(next);
  CHECK(next->id == 8);
  REQUIRE_OK(s.remove_placement_group(8));

  // A bundle recorded on a node that is gone waits for room like one lost with its node.
  REQUIRE_OK(s.place_actor(actor(200, "CPU=4")));   // fills node 2
  auto lost = s.restore_placement_group(20, spec({res("CPU=2"), res("CPU=4")}, Strategy::kPack),
                                        {NodeId(3), NodeId(99)});
  REQUIRE_OK(lost);
  CHECK(lost->state == GroupState::kRescheduling);
  CHECK(s.group(20)->bundle_nodes[0] == std::optional<NodeId>(3));
  CHECK_FALSE(s.group(20)->bundle_nodes[1].has_value());
  REQUIRE_OK(s.add_node(4, res("CPU=4")));
  CHECK(s.take_ready_groups() == std::vector<PlacementGroupId>{20});
  CHECK(s.group(20)->bundle_nodes[1] == std::optional<NodeId>(4));
  auto none = s.restore_placement_group(21, spec({res("CPU=8")}, Strategy::kPack), {std::nullopt});
  REQUIRE_OK(none);
  CHECK(none->state == GroupState::kPending);
  CHECK_OK(s.validate());
}
