// Elastic groups on real daemons: a job's group grows when a daemon joins, follows `troupe job
// scale`, and shrinks when a member's node is killed, with the job running throughout.
#include <doctest/doctest.h>

#include <signal.h>

#include <regex>
#include <thread>

#include <nlohmann/json.hpp>

#include "cluster_harness.hpp"
#include "test_actors.hpp"
#include "troupe/elastic.hpp"

namespace {

using json = nlohmann::json;

std::string last_line(const std::string& text) {
  std::string out = text;
  while (!out.empty() && out.back() == '\n') out.pop_back();
  const auto nl = out.rfind('\n');
  return nl == std::string::npos ? out : out.substr(nl + 1);
}

// Waits until the job's log holds `needle`; the log then.
std::string wait_log(const itest::Cluster& c, const std::string& id, const std::string& needle, std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string logs;
  while (std::chrono::steady_clock::now() < deadline) {
    logs = c.job({"logs", id}).output;
    if (logs.find(needle) != std::string::npos) return logs;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return logs;
}

// The values of an elastic group's call_all, each slot's value (a failed slot throws).
template <class T>
std::vector<T> values(const std::vector<troupe::Result<T>>& results) {
  std::vector<T> out;
  for (const auto& r : results) out.push_back(r.value());
  return out;
}

std::size_t count(const std::string& text, const std::string& needle) {
  std::size_t n = 0;
  for (auto at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("a job's elastic group grows when a daemon joins, follows troupe job scale, and shrinks when a node is killed") {
  itest::Cluster c("CPU=2");   // the driver's CPU=1 and room for one member
  auto s = c.job({"submit", "--no-wait", "--", TROUPE_JOB_PROGRAM, "elastic", "CPU=1"});
  REQUIRE(s.status == 0);
  const std::string id = last_line(s.output);
  std::string logs = wait_log(c, id, "size 1 epoch", std::chrono::seconds(20));
  INFO(logs);
  REQUIRE(logs.find("size 1 epoch") != std::string::npos);
  const json g = c.status()["elastic_groups"][0];
  CHECK(g["name"] == "echoes");
  CHECK(g["target"] == 4);
  CHECK(g["live"] == 1);
  CHECK(g["reason"].get<std::string>().find("waiting for resources") != std::string::npos);   // says why it is below

  const pid_t node = c.add_node("CPU=2");   // room for two more: it grows to 3
  logs = wait_log(c, id, "size 3 epoch", std::chrono::seconds(20));
  REQUIRE(logs.find("size 3 epoch") != std::string::npos);
  CHECK(count(logs, "joined welcome from pid") == 3);   // every member passed on_join before serving
  CHECK(logs.find("replies 3") != std::string::npos);

  auto scaled = c.job({"scale", id, "echoes", "--replicas", "2"});
  INFO(scaled.output);
  CHECK(scaled.status == 0);
  logs = wait_log(c, id, "size 2 epoch", std::chrono::seconds(20));
  CHECK(logs.find("size 2 epoch") != std::string::npos);
  auto out_of_range = c.job({"scale", id, "echoes", "--replicas", "9"});
  CHECK(out_of_range.status != 0);
  auto too_many = c.job({"scale", id, "echoes", "--max", "2", "--min", "3"});
  CHECK(too_many.status == 1);
  CHECK(too_many.output.find("min <= max") != std::string::npos);
  auto unknown = c.job({"scale", id, "nosuch", "--replicas", "1"});
  CHECK(unknown.status == 1);
  CHECK(unknown.output.find("has no elastic group 'nosuch'") != std::string::npos);

  // Its node killed: the member there leaves; the job keeps running with the one on the head's node.
  ::kill(node, SIGKILL);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (count(logs, "size 1 epoch") < 2 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    logs = c.job({"logs", id}).output;
  }
  CHECK(count(logs, "size 1 epoch") == 2);
  CHECK(c.job({"status", id, "--json"}).output.find("RUNNING") != std::string::npos);
  CHECK(c.job({"stop", id, "--grace-s", "2"}).status == 0);
  CHECK(c.wait_until([](const json& st) { return st.value("elastic_groups", json::array()).empty(); }, std::chrono::seconds(5)));
}

TEST_CASE("an elastic group below its min fails its calls clearly, and waits for min members only as long as it is told") {
  itest::Cluster c("CPU=2");
  auto rt = itest::connect(c, std::chrono::seconds(10));
  // Two members need CPU=2 each: none fits this node, and the wait for min is bounded.
  const auto t0 = std::chrono::steady_clock::now();
  bool refused = false;
  try {
    rt.spawn_elastic_group<Store>(troupe::Elastic{1, 2}.name("big").wait_for_min(std::chrono::milliseconds(500)),
                                  troupe::Options{}.process(true).resources("CPU=3"), 1);
  } catch (const troupe::CallError& e) {
    refused = true;
    CHECK(e.code() == troupe::ErrorCode::Unavailable);
    CHECK(std::string(e.what()).find("fewer than 1 members") != std::string::npos);
    CHECK(std::string(e.what()).find("waiting for resources") != std::string::npos);
  }
  CHECK(refused);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));

  // A min of 0: optional helpers. The group exists with no member (none fits), and its calls
  // run on no one instead of failing.
  auto helpers = rt.spawn_elastic_group<Store>(troupe::Elastic{0, 2}.name("helpers"),
                                               troupe::Options{}.process(true).resources("CPU=3"), 1);
  CHECK(helpers.size() == 0);
  CHECK(helpers.call_all(&Store::get).get().empty());
  CHECK(helpers.retryable().scatter(&Store::sleep_ms, std::vector<int>{}).result().ok());
  CHECK(helpers.call_balanced(1, &Store::get).result().error().code == troupe::ErrorCode::Unavailable);

  // One member, on the only node with `solo`: when that node dies the group is below min, and
  // its calls fail at once naming it; a new node with room brings a member back in a later epoch.
  const pid_t solo = c.add_node("CPU=1,solo=1");
  auto group = rt.spawn_elastic_group<Store>(troupe::Elastic{1, 1}.name("one"),
                                             troupe::Options{}.process(true).resources("CPU=1,solo=1"), 5);
  REQUIRE(group.size() == 1);
  CHECK(values(group.call_all(&Store::get).get()) == std::vector<int>{5});
  const auto epoch = group.epoch();
  ::kill(solo, SIGKILL);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (group.size() != 0 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  REQUIRE(group.size() == 0);
  auto failed = group.call_all(&Store::get).result();
  REQUIRE(!failed.ok());
  CHECK(failed.error().code == troupe::ErrorCode::Unavailable);
  CHECK(failed.error().message.find("elastic group one has 0 members, fewer than its min of 1") != std::string::npos);
  c.add_node("CPU=1,solo=1");
  deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (group.size() != 1 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(group.size() == 1);
  CHECK(group.epoch() > epoch + 1);
  CHECK(values(group.call_all(&Store::get).get()) == std::vector<int>{5});
}

TEST_CASE("drain of a node: its elastic members finish their calls and leave, its actors move, it shows drained, and SIGTERM drains a daemon") {
  itest::Cluster c("CPU=3");
  c.add_node("CPU=3");
  auto rt = itest::connect(c, std::chrono::seconds(20));
  auto group = rt.spawn_elastic_group<Store>(troupe::Elastic{1, 2}.name("pool"), troupe::Options{}.process(true).cpus(1), 7);
  auto plain = rt.spawn<Store>(troupe::Options{}.process(true).cpus(1).max_restarts(1), 9);
  REQUIRE(plain.call(&Store::get).get() == 9);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (group.size() < 2 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  REQUIRE(group.size() == 2);
  const auto epoch = group.epoch();

  // Busy members: their calls are under way when the drain begins, and finish, and so do the
  // calls queued behind them (2.3 s of work each: longer than any fixed grace would allow).
  auto busy = group.call_all(&Store::sleep_ms, 800);
  auto queued = group.call_all(&Store::sleep_ms, 1500);
  itest::CommandResult drained;
  std::thread drainer([&] { drained = itest::run({TROUPE_CLI, "node", "drain", "2", "--deadline-s", "10", "--address", c.address(),
                                                  "--token", c.token()}, std::chrono::seconds(40)); });
  auto done = busy.result();
  drainer.join();
  INFO(drained.output);
  REQUIRE(done.ok());
  for (const auto& slot : *done) CHECK(slot.ok());   // none lost
  auto done_later = queued.result();
  REQUIRE(done_later.ok());
  for (const auto& slot : *done_later) CHECK(slot.ok());
  CHECK(drained.status == 0);
  CHECK(drained.output.find("node 2 drained") != std::string::npos);
  CHECK(c.node(2).value("drain", "") == "drained");
  CHECK(c.node(2).value("state", "") == "alive");   // still up: it can be stopped with nothing lost
  // Everything runs on node 1 now: the group back at its target, the plain actor moved.
  const auto back_by = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (group.size() < 2 && std::chrono::steady_clock::now() < back_by) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(group.size() == 2);
  CHECK(group.epoch() > epoch);
  CHECK(values(group.call_all(&Store::get).get()) == std::vector<int>{7, 7});
  CHECK(plain.call(&Store::get).get() == 9);
  const json status_now = c.status();   // not c.status()["..."] in the loop: that temporary dies first
  for (const auto& a : status_now["actors"]) {
    if (a.value("state", "") != "dead") CHECK(a.value("node", 0) == 1);
  }
  CHECK(itest::run({TROUPE_CLI, "node", "drain", "9", "--address", c.address(), "--token", c.token()}).status == 1);

  // SIGTERM to a node's daemon: a preemption notice. It drains, then stops.
  const pid_t third = c.add_node("CPU=1");
  ::kill(third, SIGTERM);
  const auto gone_by = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (::kill(third, 0) == 0 && std::chrono::steady_clock::now() < gone_by) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(::kill(third, 0) != 0);
  const json n3 = c.node(3);
  CHECK(n3.value("drain", "") == "drained");
  CHECK(n3.value("state", "") == "dead");
}

TEST_CASE("retryable group calls on an elastic group are re-sent to a live member when theirs dies with its node or freezes") {
  itest::Cluster c("CPU=1");
  const pid_t second = c.add_node("CPU=1");
  auto rt = itest::connect(c, std::chrono::seconds(20));
  auto group = rt.spawn_elastic_group<Store>(troupe::Elastic{1, 2}.name("pair"), troupe::Options{}.process(true).cpus(1), 3);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (group.size() < 2 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  REQUIRE(group.size() == 2);   // one member on each node
  auto shards = group.retryable().scatter(&Store::sleep_ms, std::vector<int>{400, 400});
  std::vector<troupe::Future<int>> balanced;
  for (int i = 0; i < 4; ++i) balanced.push_back(group.retryable().call_balanced(1, &Store::add, 1));
  auto plain = group.call_all(&Store::sleep_ms, 400);
  ::kill(second, SIGKILL);
  CHECK(shards.result().ok());   // the dead member's shard ran on the other
  for (auto& f : balanced) CHECK(f.result().ok());
  auto all = plain.get();        // per member: the departed member's slot has its ActorDied
  REQUIRE(all.size() == 2);
  CHECK(all[0].ok() != all[1].ok());
  for (const auto& slot : all) {
    if (!slot.ok()) CHECK(slot.error().code == troupe::ErrorCode::ActorDied);
  }

  // A frozen node (SIGSTOP of its daemon and its worker): after the node timeout its member is
  // dead, its retryable shard runs on the other, and the group leaves it in a later epoch.
  auto wait_size = [&](std::size_t n) {
    const auto by = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (group.size() != n && std::chrono::steady_clock::now() < by) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    return group.size() == n;
  };
  REQUIRE(wait_size(1));
  const pid_t third = c.add_node("CPU=1");
  REQUIRE(wait_size(2));
  const auto before = group.epoch();
  std::vector<pid_t> frozen{third};
  const json now = c.status();   // not c.status()["..."] in the loop: that temporary dies first
  for (const auto& a : now["actors"]) {
    if (a.value("node", 0) == 3 && a.value("state", "") == "alive") frozen.push_back(pid_t(a.value("pid", 0)));
  }
  REQUIRE(frozen.size() == 2);
  auto frozen_shards = group.retryable().scatter(&Store::sleep_ms, std::vector<int>{300, 300});
  for (pid_t p : frozen) ::kill(p, SIGSTOP);
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(frozen_shards.result().ok());
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(15));   // the node timeout, not forever
  CHECK(wait_size(1));
  CHECK(group.epoch() > before);
  for (pid_t p : frozen) ::kill(p, SIGCONT);   // it finds itself dead, and stops
}
