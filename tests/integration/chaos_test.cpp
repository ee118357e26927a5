// Chaos: kill -9 of workers and daemons, SIGSTOP of a daemon. Every future resolves (FT-1),
// restarted actors keep their id (FT-2), dead nodes stay dead (FT-3).
#include <doctest/doctest.h>

#include <signal.h>

#include "cluster_harness.hpp"
#include "test_actors.hpp"

using namespace std::chrono_literals;
using troupe::ErrorCode;
using nlohmann::json;

namespace {

troupe::Runtime connect(const itest::Cluster& c) { return itest::connect(c, 30s); }

// Waits for the future with a generous bound: it must resolve by itself (FT-1).
template <class T>
bool resolves(const troupe::Future<T>& f) { return f.wait_for(20s); }

}  // namespace

TEST_CASE("kill -9 of a worker restarts its actor until max_restarts, then calls fail with ActorDied") {
  itest::Cluster cluster;
  auto rt = connect(cluster);
  auto s = rt.spawn<Store>(troupe::Options{}.process(true).max_restarts(1), 5);
  REQUIRE(s.ready().wait_for(30s));
  int pid1 = s.call(&Store::pid).get();
  CHECK(s.call(&Store::add, 1).get() == 6);

  auto busy = s.call(&Store::sleep_ms, 5000);   // in flight when the process dies; no retries
  std::this_thread::sleep_for(200ms);
  REQUIRE(::kill(pid1, SIGKILL) == 0);
  REQUIRE(resolves(busy));
  CHECK(busy.result().error().code == ErrorCode::ActorDied);

  // Restarted: same id, new process, constructor re-run (state back to 5).
  auto after = s.with_timeout(20s).call(&Store::get);
  REQUIRE(resolves(after));
  CHECK(after.get() == 5);
  int pid2 = s.call(&Store::pid).get();
  CHECK(pid2 != pid1);
  CHECK(cluster.actor(s.id()).value("restarts", 0) == 1);

  REQUIRE(::kill(pid2, SIGKILL) == 0);   // the last restart is used up
  CHECK(cluster.wait_until([&](const json&) { return cluster.actor(s.id()).value("state", "") == "dead"; }, 10s));
  auto dead = s.call(&Store::get);
  REQUIRE(resolves(dead));
  CHECK(dead.result().error().code == ErrorCode::ActorDied);
}

TEST_CASE("calls in flight at a worker's death are retried on the restarted actor with max_retries") {
  itest::Cluster cluster;
  auto rt = connect(cluster);
  auto s = rt.spawn<Store>(troupe::Options{}.process(true).max_restarts(-1).max_retries(2), 0);
  REQUIRE(s.ready().wait_for(30s));
  int pid1 = s.call(&Store::pid).get();
  auto busy = s.call(&Store::sleep_ms, 3000);
  std::vector<troupe::Future<int>> queued;
  for (int i = 0; i < 5; ++i) queued.push_back(s.call(&Store::add, 1));
  std::this_thread::sleep_for(200ms);
  REQUIRE(::kill(pid1, SIGKILL) == 0);
  REQUIRE(resolves(busy));
  CHECK(busy.result().ok());
  for (std::size_t i = 0; i < queued.size(); ++i) {
    REQUIRE(resolves(queued[i]));
    CHECK(queued[i].get() == int(i) + 1);   // resent in submission order to the new incarnation
  }
  CHECK(s.call(&Store::pid).get() != pid1);
}

TEST_CASE("a daemon killed with -9 and another frozen with SIGSTOP are marked dead, and their actors move") {
  itest::Cluster cluster("CPU=4,spare=1");
  pid_t killed = cluster.add_node("CPU=1,victim_a=1,movable=1");
  pid_t frozen = cluster.add_node("CPU=1,victim_b=1");
  auto rt = connect(cluster);
  // a and b cannot restart (max_restarts 0); c can, and needs `movable`, which only the killed
  // node has until a new node brings some.
  auto a = rt.spawn<Store>(troupe::Options{}.resources("victim_a=1").max_restarts(0), 1);
  auto b = rt.spawn<Store>(troupe::Options{}.resources("victim_b=1").max_restarts(0), 2);
  auto c = rt.spawn<Store>(troupe::Options{}.resources("movable=1").max_restarts(3).max_retries(1), 3);
  REQUIRE(a.ready().wait_for(30s));
  REQUIRE(b.ready().wait_for(30s));
  REQUIRE(c.ready().wait_for(30s));
  const auto node_a = cluster.actor(a.id()).value("node", std::uint64_t{0});
  const auto node_b = cluster.actor(b.id()).value("node", std::uint64_t{0});
  CHECK(node_a != 0);
  CHECK(cluster.actor(c.id()).value("node", std::uint64_t{0}) == node_a);

  auto t0 = std::chrono::steady_clock::now();
  REQUIRE(::kill(killed, SIGKILL) == 0);
  REQUIRE(::kill(frozen, SIGSTOP) == 0);
  bool both_dead = cluster.wait_until([&](const json& st) {
    int dead = 0;
    for (const auto& n : st.value("nodes", json::array())) {
      if ((n.value("id", std::uint64_t{0}) == node_a || n.value("id", std::uint64_t{0}) == node_b) &&
          n.value("state", "") == "dead") ++dead;
    }
    return dead == 2;
  }, 10s);
  auto took = std::chrono::steady_clock::now() - t0;
  CHECK(both_dead);
  CHECK(took < 3s + 500ms);   // the default timeout is 2.5 s; status polling adds a little

  // Actors that cannot restart anywhere fail; none hangs (FT-1).
  auto fa = a.call(&Store::get), fb = b.call(&Store::get);
  REQUIRE(resolves(fa));
  REQUIRE(resolves(fb));
  CHECK(fa.result().error().code == ErrorCode::ActorDied);
  CHECK(fb.result().error().code == ErrorCode::ActorDied);
  // The restartable one waits, pending, for a node with room; one joins and it runs there.
  auto fc = c.with_timeout(20s).call(&Store::add, 1);
  cluster.add_node("CPU=1,movable=1");
  REQUIRE(resolves(fc));
  CHECK(fc.get() == 4);   // a fresh incarnation: constructed with 3, then this call
  const auto node_c = cluster.actor(c.id()).value("node", std::uint64_t{0});
  CHECK(node_c != 0);
  CHECK(node_c != node_a);
  CHECK(node_c != node_b);
  ::kill(frozen, SIGCONT);   // FT-3: it comes back to find itself dead, and stops
  CHECK(cluster.wait_until([&](const json& st) {
    for (const auto& n : st.value("nodes", json::array())) {
      if (n.value("id", std::uint64_t{0}) == node_b && n.value("state", "") != "dead") return false;
    }
    return true;
  }, 3s));
}
