// Chaos: kill -9 of workers, daemons and drivers, SIGSTOP of a daemon. Every future resolves
// (FT-1), restarted actors keep their id (FT-2), dead nodes stay dead (FT-3), a dead driver's
// actors and groups go with it (JOB-1).
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <sstream>

#include "support/helper_main.hpp"

#include "cluster_harness.hpp"
#include "test_actors.hpp"
#include "troupe/ids.hpp"

using namespace std::chrono_literals;
using troupe::ErrorCode;
using nlohmann::json;

namespace {

troupe::Runtime connect(const itest::Cluster& c) { return itest::connect(c, 30s); }

// Waits for the future with a generous bound: it must resolve by itself (FT-1).
template <class T>
bool resolves(const troupe::Future<T>& f) { return f.wait_for(20s); }

// A driver in its own process ("ADDRESS TOKEN"): an owned actor, a detached one and an owned
// placement group; prints their ids once all are up, then waits to be killed.
int owning_driver(const std::string& arg) {
  std::istringstream in(arg);
  troupe::RuntimeConfig cfg;
  in >> cfg.address >> cfg.token;
  auto rt = troupe::Runtime::create(cfg).value();
  auto owned = rt.spawn<Store>(troupe::Options{}.resources("owned=1"), 1);
  auto kept = rt.spawn<Store>(troupe::Options{}.resources("owned=1").lifetime_detached(), 2);
  auto group = rt.placement_group({"CPU=1"});
  auto kept_group = rt.placement_group({"CPU=1"}, "PACK", "kept", /*lifetime_detached=*/true);
  if (!owned.ready().wait_for(30s) || !kept.ready().wait_for(30s) || !group.ready(30s) || !kept_group.ready(30s)) return 1;
  std::cout << owned.id() << ' ' << kept.id() << ' ' << group.id() << ' ' << kept_group.id() << std::endl;
  for (;;) ::pause();
}
TROUPE_TEST_HELPER("owning-driver", owning_driver);

// A driver ("ADDRESS TOKEN") with an owned actor and a child process that inherits its sockets
// (as a fork without exec does), so its link to the head does not end when it is killed; prints
// "ACTOR CHILD_PID" once the actor is up.
int forking_driver(const std::string& arg) {
  std::istringstream in(arg);
  troupe::RuntimeConfig cfg;
  in >> cfg.address >> cfg.token;
  auto rt = troupe::Runtime::create(cfg).value();
  auto owned = rt.spawn<Store>(troupe::Options{}.resources("owned=1"), 1);
  if (!owned.ready().wait_for(30s)) return 1;
  const pid_t child = ::fork();
  if (child == 0) {
    for (;;) ::pause();   // async-signal-safe only: it holds the descriptors, nothing else
  }
  std::cout << owned.id() << ' ' << child << std::endl;
  for (;;) ::pause();
}
TROUPE_TEST_HELPER("forking-driver", forking_driver);

// A test process with a cluster of a head and a node; prints "DIR HEAD_PID NODE_PID" (the pids
// in any order), then waits to be killed.
int cluster_owner(const std::string&) {
  itest::Cluster cluster;
  cluster.add_node("CPU=1");
  std::cout << cluster.temp_dir();
  for (pid_t p : cluster.daemon_pids()) std::cout << ' ' << p;
  std::cout << std::endl;
  for (;;) ::pause();
}
TROUPE_TEST_HELPER("cluster-owner", cluster_owner);

}  // namespace

TEST_CASE("kill -9 of a driver: its actors and placement groups go and their resources come free, detached ones stay") {
  itest::Cluster cluster;
  cluster.add_node("CPU=4,owned=2");
  int out = -1;
  const pid_t driver = itest::start_helper("owning-driver", cluster.address() + " " + cluster.token(), &out);
  std::istringstream ids(itest::read_line(out, 60s));
  std::uint64_t owned = 0, kept = 0, group = 0, kept_group = 0;
  ids >> owned >> kept >> group >> kept_group;
  REQUIRE(owned != 0);
  REQUIRE(kept != 0);
  REQUIRE(group != 0);
  REQUIRE(kept_group != 0);
  auto before = cluster.status();
  CHECK(cluster.actor(owned).value("state", "") == "alive");
  CHECK(cluster.actor(owned).value("owner", std::uint64_t{0}) != 0);
  CHECK(cluster.actor(kept).value("owner", std::uint64_t{1}) == 0);
  REQUIRE(before["placement_groups"].size() == 2);

  REQUIRE(::kill(driver, SIGKILL) == 0);   // no clean exit: the head learns it from the link's end
  ::waitpid(driver, nullptr, 0);
  ::close(out);
  CHECK(cluster.wait_until([&](const json& st) {
    bool owned_dead = false, kept_alive = false;
    for (const auto& a : st["actors"]) {
      if (a.value("id", std::uint64_t{0}) == owned) owned_dead = a.value("state", "") == "dead";
      if (a.value("id", std::uint64_t{0}) == kept) kept_alive = a.value("state", "") == "alive";
    }
    return owned_dead && kept_alive && st["placement_groups"].size() == 1 &&
           st["placement_groups"][0].value("id", std::uint64_t{0}) == kept_group;
  }, 10s));
  // What the owned actor held is free again; the detached one still holds its own.
  CHECK(cluster.wait_until([&](const json& st) {
    for (const auto& n : st["nodes"]) {
      if (n.value("resources", "").find("owned=2") != std::string::npos) {
        return n.value("available", "").find("owned=1") != std::string::npos;
      }
    }
    return false;
  }, 10s));

  // What no driver owns is removed by hand.
  const std::vector<std::string> to_head{"--address", cluster.address(), "--token", cluster.token()};
  auto with = [&](std::vector<std::string> args) { args.insert(args.end(), to_head.begin(), to_head.end()); return args; };
  int rc = -1;
  cluster.cli(with({"actor", "kill", std::to_string(kept)}), &rc);
  CHECK(rc == 0);
  cluster.cli(with({"pg", "remove", std::to_string(kept_group)}), &rc);
  CHECK(rc == 0);
  auto after = cluster.status();
  CHECK(cluster.actor(kept).value("state", "") == "dead");
  CHECK(after["placement_groups"].empty());
  CHECK(cluster.wait_until([&](const json& st) {   // every node whole again
    for (const auto& n : st["nodes"]) {
      if (n.value("available", "") != n.value("resources", "")) return false;
    }
    return true;
  }, 10s));
  const std::string refused = cluster.cli(with({"pg", "remove", std::to_string(kept_group)}), &rc);
  CHECK(rc == 1);
  CHECK(refused.find("no placement group " + std::to_string(kept_group)) != std::string::npos);
  cluster.cli(with({"actor", "kill", "nope"}), &rc);
  CHECK(rc != 0);
}

TEST_CASE("kill -9 of a driver whose link a child process keeps open: the head sees the process exit") {
  itest::Cluster cluster;
  cluster.add_node("CPU=2,owned=1");
  int out = -1;
  const pid_t driver = itest::start_helper("forking-driver", cluster.address() + " " + cluster.token(), &out);
  std::istringstream ids(itest::read_line(out, 60s));
  std::uint64_t owned = 0;
  pid_t child = 0;
  ids >> owned >> child;
  REQUIRE(owned != 0);
  REQUIRE(child > 0);
  REQUIRE(::kill(driver, SIGKILL) == 0);   // its sockets live on in the child: no EOF at the head
  ::waitpid(driver, nullptr, 0);
  ::close(out);
  const bool reaped = cluster.wait_until([&](const json& st) {
    for (const auto& a : st["actors"]) {
      if (a.value("id", std::uint64_t{0}) == owned) return a.value("state", "") == "dead";
    }
    return false;
  }, 10s);
  ::kill(child, SIGKILL);
  CHECK(reaped);
  // Reaped by its process's exit (the head's pidfd), not by the link's silence 2.5 s later.
  CHECK(cluster.actor(owned).value("reason", "").find("process exited") != std::string::npos);
}

TEST_CASE("kill -9 of a test process that owns a cluster: its guard stops the cluster's daemons and removes its files") {
  int out = -1;
  const pid_t owner = itest::start_helper("cluster-owner", "-", &out);
  std::istringstream line(itest::read_line(out, 60s));
  std::string dir;
  line >> dir;
  std::vector<pid_t> daemons;
  for (pid_t p = 0; line >> p;) daemons.push_back(p);
  REQUIRE(dir.rfind("/tmp/troupe-it-", 0) == 0);
  REQUIRE(daemons.size() == 2);
  for (pid_t p : daemons) CHECK(!itest::process_gone(p));
  REQUIRE(::kill(owner, SIGKILL) == 0);   // no destructor runs
  ::waitpid(owner, nullptr, 0);
  ::close(out);
  auto gone = [&] {
    return std::all_of(daemons.begin(), daemons.end(), itest::process_gone) && !std::filesystem::exists(dir);
  };
  for (int i = 0; i < 200 && !gone(); ++i) std::this_thread::sleep_for(50ms);
  CHECK(gone());
  for (pid_t p : daemons) {
    if (!itest::process_gone(p)) ::kill(p, SIGKILL);   // what the guard left, so that no daemon outlives this test
  }
}

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
  // Named as in-process actors are (defect 7): type and number, not the raw id.
  const std::string label = "Store#" + std::to_string(s.id() - troupe::kClusterActorBase);
  CHECK(busy.result().error().message.find(label) != std::string::npos);
  CHECK(busy.result().error().message.find(std::to_string(s.id())) == std::string::npos);
  CHECK(cluster.actor(s.id()).value("label", "") == label);

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

TEST_CASE("kill -9 of the head: a driver's calls waiting for a restart fail, naming the head, and none hangs") {
  itest::Cluster cluster;   // one daemon: the head, with its node
  const auto daemons = cluster.daemon_pids();
  REQUIRE(daemons.size() == 1);
  auto rt = connect(cluster);   // calls time out after 30 s
  // Retried on a restart: its calls wait for the head to place the actor again, and none will.
  auto s = rt.spawn<Store>(troupe::Options{}.process(true).max_restarts(-1).max_retries(2), 0);
  REQUIRE(s.ready().wait_for(30s));
  auto busy = s.call(&Store::sleep_ms, 3000);
  std::this_thread::sleep_for(200ms);
  REQUIRE(::kill(daemons.front(), SIGKILL) == 0);   // its worker goes with it (it stops on the head's loss)
  REQUIRE(busy.wait_for(10s));
  REQUIRE_FALSE(busy.result().ok());
  CHECK(busy.result().error().message.find("the link to the head ended") != std::string::npos);
  auto later = s.call(&Store::get);
  REQUIRE(later.wait_for(5s));
  REQUIRE_FALSE(later.result().ok());
  CHECK(later.result().error().message.find("the link to the head ended") != std::string::npos);
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
