// The head in-process: its HTTP API refuses bad tokens and bad bodies with clear errors and keeps
// what it stored; the SQLite store round-trips rows.
#include <doctest/doctest.h>

#include <filesystem>
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

TEST_CASE("the head writes the nodes it registers to its SQLite store, which round-trips rows byte-exact") {
  TempDir dir;
  {
    control::Head head(control::HeadConfig{"127.0.0.1", 0, "secret", dir.path});
    REQUIRE(call(head, "POST", "/api/v1/nodes", R"({"address":"127.0.0.1","resources":"CPU=2"})").status == 200);
  }
  auto store = control::open_sqlite_store((std::filesystem::path(dir.path) / "store.db").string());
  auto nodes = store->nodes();
  REQUIRE(nodes.size() == 1);
  CHECK(nodes[0].resources == "CPU=2");
  control::ActorRow a;
  a.id = 42;
  a.type = "T";
  a.ctor_args = std::string("\0\x01\xff", 3);   // binary-safe
  store->put_actor(a);
  auto actors = store->actors();
  REQUIRE(actors.size() == 1);
  CHECK(actors[0].ctor_args == a.ctor_args);
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
