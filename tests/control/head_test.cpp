// The head in-process: its HTTP API refuses bad tokens and bad bodies with clear errors and keeps
// what it stored; the SQLite store round-trips records, refuses stores it did not write, and a
// head started on another head's store finds its nodes, actors and groups.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "support/temp_dir.hpp"
#include "troupe/control/head.hpp"
#include "troupe/control/store.hpp"
#include "troupe/net/http.hpp"

using nlohmann::json;
namespace control = troupe::control;
namespace net = troupe::net;

namespace {

using test_support::TempDir;

net::HttpResponse call(const control::Head& h, const std::string& method, const std::string& target,
                       const std::string& body, const std::string& token = "secret") {
  return net::http_call("127.0.0.1", h.port(), method, target, body, token, std::chrono::seconds(5));
}

}  // namespace

TEST_CASE("the head refuses calls without the cluster token") {
  TempDir dir;
  control::Head head(control::HeadConfig{"127.0.0.1", 0, "secret", dir.path});
  CHECK(call(head, "GET", "/api/v1/status", "", "").status == 401);
  CHECK(call(head, "GET", "/api/v1/status", "", "secrex").status == 401);
  auto ok = call(head, "GET", "/api/v1/status", "");
  CHECK(ok.status == 200);
  CHECK(json::parse(ok.body)["nodes"].empty());
}

TEST_CASE("bad bodies get a 400 with a reason and change nothing") {
  TempDir dir;
  control::Head head(control::HeadConfig{"127.0.0.1", 0, "secret", dir.path});
  auto good = call(head, "POST", "/api/v1/nodes", R"({"address":"127.0.0.1","resources":"CPU=2"})");
  REQUIRE(good.status == 200);
  for (const char* body : {"", "{", "[1,2]", R"({"resources":"CPU=two"})", R"({"resources":"GPU=1.5,GPU=1"})"}) {
    auto r = call(head, "POST", "/api/v1/nodes", body);
    CHECK(r.status == 400);
    CHECK(json::parse(r.body).contains("error"));
  }
  auto bad_actor = call(head, "POST", "/api/v1/actors", R"({"type":"X","ctor_signature":"s","ctor_args":"00","binary":"/bin/true","resources":"CPU=-1"})");
  CHECK(bad_actor.status == 400);
  CHECK(call(head, "POST", "/api/v1/actors", R"({"type":"X"})").status == 400);   // fields missing
  CHECK(call(head, "GET", "/api/v1/actors/notanumber", "").status == 404);
  CHECK(call(head, "GET", "/api/v1/nowhere", "").status == 404);
  auto status = json::parse(call(head, "GET", "/api/v1/status", "").body);
  CHECK(status["nodes"].size() == 1);
  CHECK(status["actors"].empty());
}

TEST_CASE("the head writes the nodes it registers to its SQLite store, which round-trips records byte-exact") {
  TempDir dir;
  {
    control::Head head(control::HeadConfig{"127.0.0.1", 0, "secret", dir.path});
    REQUIRE(call(head, "POST", "/api/v1/nodes", R"({"address":"127.0.0.1","resources":"CPU=2"})").status == 200);
  }
  auto store = control::open_sqlite_store((std::filesystem::path(dir.path) / "store.db").string());
  auto nodes = store->nodes();
  REQUIRE(nodes.size() == 1);
  CHECK(nodes[0].total.to_string() == "CPU=2");
  CHECK(nodes[0].state == control::NodeState::Alive);
  control::ActorRecord a;
  a.id = 42;
  a.spec.type = "T";
  a.spec.ctor_args = {'\0', '\x01', '\xff'};   // binary-safe
  a.spec.resources = *troupe::placement::Resources::parse("CPU=0.5");
  a.spec.placement_group = 7;
  a.spec.bundle_index = 1;
  a.state = control::ActorState::Restarting;
  a.node = 3;
  a.worker = 9;
  a.bundle = 1;
  a.reserved = true;
  a.incarnation = 4;
  store->put_actor(a);
  auto actors = store->actors();
  REQUIRE(actors.size() == 1);
  CHECK(actors[0].spec.ctor_args == a.spec.ctor_args);
  CHECK(actors[0].spec.resources == a.spec.resources);
  CHECK(actors[0].spec.placement_group == 7);
  CHECK(actors[0].state == control::ActorState::Restarting);
  CHECK(actors[0].node == 3);
  CHECK(actors[0].worker == 9);
  CHECK(actors[0].bundle == 1);
  CHECK(actors[0].reserved);
  CHECK(actors[0].incarnation == 4);
  control::GroupRecord g;
  g.id = 7;
  g.strategy = troupe::placement::Strategy::kSpread;
  g.bundles = {*troupe::placement::Resources::parse("CPU=1"), *troupe::placement::Resources::parse("GPU=1")};
  g.bundle_nodes = {3, 0};
  store->put_group(g);
  auto groups = store->groups();
  REQUIRE(groups.size() == 1);
  CHECK(groups[0].strategy == troupe::placement::Strategy::kSpread);
  CHECK(groups[0].bundles == g.bundles);
  CHECK(groups[0].bundle_nodes == g.bundle_nodes);
  store->remove_group(7);
  CHECK(store->groups().empty());
  store->put_meta("k", "v");
  CHECK(store->get_meta("k") == std::optional<std::string>("v"));
  CHECK_FALSE(store->get_meta("missing").has_value());
  try {
    (void)control::open_sqlite_store("/nonexistent-dir/x/store.db");
    FAIL("opened a store in a directory that does not exist");
  } catch (const troupe::ErrorException& e) {
    CHECK(e.code() == troupe::ControlCode::Store);
  }
}

TEST_CASE("a store another version wrote, or a file that is no database, is refused and left as it was") {
  TempDir dir;
  const auto path = (std::filesystem::path(dir.path) / "store.db").string();
  {
    auto store = control::open_sqlite_store(path);
    store->put_meta("schema", "1");   // as an older troupe would have left it
  }
  auto expect_refused = [&] {
    try {
      (void)control::open_sqlite_store(path);
      FAIL("opened a store this version did not write");
    } catch (const troupe::ErrorException& e) {
      CHECK(e.code() == troupe::ControlCode::Store);
    }
    CHECK_THROWS_AS(control::Head(control::HeadConfig{"127.0.0.1", 0, "secret", dir.path}), troupe::ErrorException);
  };
  expect_refused();
  std::filesystem::remove(path + "-wal");
  std::filesystem::remove(path + "-shm");
  {
    std::ofstream junk(path, std::ios::trunc);
    junk << "this is not an SQLite database, just text long enough to fill a header page";
  }
  const auto before = std::filesystem::file_size(path);
  expect_refused();
  CHECK(std::filesystem::file_size(path) == before);
}

TEST_CASE("a head started on the store another head wrote finds the same nodes, actors and groups") {
  TempDir dir;
  json before;
  std::uint64_t last_actor = 0;
  std::uint64_t next_worker_seen = 0;
  {
    control::Head head(control::HeadConfig{"127.0.0.1", 0, "secret", dir.path});
    auto n1 = json::parse(call(head, "POST", "/api/v1/nodes", R"({"address":"127.0.0.1","hostname":"a","resources":"CPU=2"})").body);
    auto n2 = json::parse(call(head, "POST", "/api/v1/nodes", R"({"address":"127.0.0.1","hostname":"b","resources":"CPU=2"})").body);
    REQUIRE(n1.at("node_id") != n2.at("node_id"));
    auto group = json::parse(call(head, "POST", "/api/v1/placement_groups", R"({"bundles":["CPU=1","CPU=1"],"strategy":"STRICT_SPREAD"})").body);
    REQUIRE(group.value("state", "") == "CREATED");
    const auto gid = group.at("id").get<std::uint64_t>();
    // One actor in bundle 1, brought up by a (simulated) worker; one waiting for a GPU; one killed.
    auto in_bundle = json::parse(call(head, "POST", "/api/v1/actors",
        json{{"type", "T"}, {"ctor_signature", "s"}, {"ctor_args", "00ff"}, {"binary", "/bin/true"},
             {"resources", "CPU=1"}, {"placement_group", gid}, {"bundle_index", 1}, {"max_restarts", 2}}.dump()).body);
    auto waiting = json::parse(call(head, "POST", "/api/v1/actors",
        R"({"type":"T","ctor_signature":"s","ctor_args":"","binary":"/bin/true","resources":"GPU=1"})").body);
    auto killed = json::parse(call(head, "POST", "/api/v1/actors",
        R"({"type":"T","ctor_signature":"s","ctor_args":"","binary":"/bin/true","resources":"CPU=1"})").body);
    REQUIRE(in_bundle.value("state", "") == "pending");
    const auto a1 = in_bundle.at("actor_id").get<std::uint64_t>();
    last_actor = killed.at("actor_id").get<std::uint64_t>();
    REQUIRE(call(head, "POST", "/api/v1/actors/" + std::to_string(last_actor) + "/kill", R"({"reason":"test"})").status == 200);
    auto a1_view = json::parse(call(head, "GET", "/api/v1/actors/" + std::to_string(a1), "").body);
    const auto worker = a1_view.at("worker").get<std::uint64_t>();
    REQUIRE(worker != 0);
    const auto wpath = "/api/v1/workers/" + std::to_string(worker);
    REQUIRE(call(head, "POST", wpath + "/ready", R"({"gateway":"127.0.0.1:4242","pid":4242})").status == 200);
    REQUIRE(call(head, "POST", wpath + "/events",
                 json{{"events", json::array({json{{"kind", "actor_ready"}, {"actor_id", a1},
                                                   {"incarnation", a1_view.at("incarnation")}}})}}.dump()).status == 200);
    before = json::parse(call(head, "GET", "/api/v1/status", "").body);
    next_worker_seen = worker;
  }
  control::Head head(control::HeadConfig{"127.0.0.1", 0, "secret", dir.path});
  auto after = json::parse(call(head, "GET", "/api/v1/status", "").body);

  REQUIRE(after["nodes"].size() == before["nodes"].size());
  for (std::size_t i = 0; i < before["nodes"].size(); ++i) {
    const auto &b = before["nodes"][i], &a = after["nodes"][i];
    for (const char* key : {"id", "address", "hostname", "state", "resources", "available"}) {
      CAPTURE(key);
      CHECK(a[key] == b[key]);
    }
  }
  REQUIRE(after["actors"].size() == 3);
  REQUIRE(after["actors"].size() == before["actors"].size());
  for (std::size_t i = 0; i < before["actors"].size(); ++i) {
    const auto &b = before["actors"][i], &a = after["actors"][i];
    for (const char* key : {"id", "type", "state", "node", "worker", "pid", "gateway", "incarnation", "restarts",
                            "max_restarts", "resources"}) {
      CAPTURE(key);
      CHECK(a[key] == b[key]);
    }
  }
  CHECK(after["actors"][0].value("state", "") == "alive");
  CHECK(after["actors"][1].value("state", "") == "pending");
  CHECK(after["actors"][2].value("state", "") == "dead");
  REQUIRE(after["placement_groups"].size() == 1);
  CHECK(after["placement_groups"] == before["placement_groups"]);   // id, state, bundles' nodes and room, actors

  // Ids continue above what the first head handed out; the loaded actor's worker is known again.
  auto fresh = json::parse(call(head, "POST", "/api/v1/actors",
      R"({"type":"T","ctor_signature":"s","ctor_args":"","binary":"/bin/true","resources":"CPU=1"})").body);
  CHECK(fresh.at("actor_id").get<std::uint64_t>() > last_actor);
  auto fresh_view = json::parse(call(head, "GET", "/api/v1/actors/" + std::to_string(fresh.at("actor_id").get<std::uint64_t>()), "").body);
  CHECK(fresh_view.at("worker").get<std::uint64_t>() > next_worker_seen);
  CHECK(call(head, "POST", "/api/v1/workers/" + std::to_string(next_worker_seen) + "/poll", "{}").status == 200);
}

TEST_CASE("a placement group's GET with wait_ms is answered when the group's state changes, not at the wait") {
  TempDir dir;
  control::Head head(control::HeadConfig{"127.0.0.1", 0, "secret", dir.path});
  auto created = json::parse(call(head, "POST", "/api/v1/placement_groups", R"({"bundles":["GPU=1"],"strategy":"PACK"})").body);
  REQUIRE(created.value("state", "") == "PENDING");   // no node has a GPU yet
  const auto target = "/api/v1/placement_groups/" + std::to_string(created.at("id").get<std::uint64_t>());
  auto t0 = std::chrono::steady_clock::now();
  auto still = json::parse(call(head, "GET", target + "?wait_ms=300", "").body);
  CHECK(still.value("state", "") == "PENDING");   // nothing changed: answered at the wait
  CHECK(std::chrono::steady_clock::now() - t0 >= std::chrono::milliseconds(250));
  CHECK(call(head, "GET", target + "?wait_ms=soon", "").status == 400);

  std::thread joiner([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    call(head, "POST", "/api/v1/nodes", R"({"address":"127.0.0.1","resources":"CPU=2,GPU=1"})");
  });
  t0 = std::chrono::steady_clock::now();
  auto ready = json::parse(call(head, "GET", target + "?wait_ms=5000", "").body);
  const auto took = std::chrono::steady_clock::now() - t0;
  joiner.join();
  CHECK(ready.value("state", "") == "CREATED");
  CHECK(took < std::chrono::seconds(3));   // woken by the node's arrival, not the 5 s wait
}
