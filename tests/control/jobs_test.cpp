// The head's job controller in-process, with a node daemon's side of its link played by the test:
// submit, the orders pushed, what the node reports, attempts, logs, a reload; and job packages
// (pack, check, unpack, the node's cache) without any process.
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "support/temp_dir.hpp"
#include "troupe/control/head.hpp"
#include "troupe/control/package.hpp"
#include "troupe/net/head_link.hpp"
#include "troupe/net/http.hpp"
#include "troupe/net/link.hpp"

using nlohmann::json;
namespace control = troupe::control;
namespace net = troupe::net;
namespace fs = std::filesystem;

namespace {

using test_support::TempDir;

json api(const control::Head& h, const std::string& method, const std::string& target, const json& body = nullptr,
         int* status = nullptr) {
  auto res = net::http_call("127.0.0.1", h.port(), method, target, body.is_null() ? "" : body.dump(), "secret",
                            std::chrono::seconds(5));
  if (status != nullptr) *status = res.status;
  return json::parse(res.body, nullptr, false);
}

json next_order(net::HeadSession& s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < deadline) {
    auto m = s.next(std::chrono::milliseconds(200));
    if (m && m->kind == net::head_kind::kOrder) return m->body;
    if (m && m->kind == 0) return nullptr;
  }
  return nullptr;
}

void report(net::HeadSession& s, const json& event) { s.send(net::head_kind::kEvents, json{{"events", json::array({event})}}); }

template <class Pred>
json job_until(const control::Head& h, std::uint64_t id, Pred pred) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  json j;
  while (std::chrono::steady_clock::now() < deadline) {
    j = api(h, "GET", "/api/v1/jobs/" + std::to_string(id));
    if (pred(j)) return j;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return j;
}

}  // namespace

TEST_CASE("the head runs a job on a node's link: start orders, reports, a retried attempt, logs, and its record after a reload") {
  TempDir dir("troupe-jobs-head");
  std::uint64_t id = 0;
  {
    control::HeadConfig cfg;
    cfg.token = "secret";
    cfg.session_dir = dir.path;
    control::Head head(cfg);
    net::LinkHub hub("secret", net::self_identity("test"));
    auto node = std::make_unique<net::HeadSession>(hub, head.link_address(),
                                                   json{{"role", "node"}, {"resources", "CPU=2,GPU=2"}}, std::chrono::seconds(5));
    const json job = api(head, "POST", "/api/v1/jobs",
                         json{{"entrypoint", {"sh", "-c", "true"}}, {"max_attempts", 2}, {"env", {{"A", "1"}}}, {"name", "t"}});
    id = job.at("id").get<std::uint64_t>();
    CHECK(job["state"] == "PENDING");
    CHECK(job["created"] == true);

    json start = next_order(*node);
    REQUIRE(start.is_object());
    CHECK(start["kind"] == "start_driver");
    CHECK(start["job"] == id);
    CHECK(start["attempt"] == 1);
    CHECK(start["entrypoint"] == json::array({"sh", "-c", "true"}));
    CHECK(start["env"]["A"] == "1");
    CHECK(api(head, "GET", "/api/v1/status")["nodes"][0]["available"].get<std::string>().find("CPU=1") != std::string::npos);   // the driver's CPU=1 is held

    report(*node, json{{"kind", "driver_started"}, {"job", id}, {"attempt", 1}, {"pid", 4242}});
    node->send_bytes(net::head_kind::kLog, net::encode_log(net::LogPiece{id, 0, "first line\n"}));
    json started = job_until(head, id, [](const json& j) { return j["driver_pid"] == 4242; });
    CHECK(started["message"].get<std::string>().find("driver started on node 1") != std::string::npos);

    // A report of another attempt is stale; the failure of this one starts attempt 2.
    report(*node, json{{"kind", "driver_exited"}, {"job", id}, {"attempt", 7}, {"status", "exit 0"}});
    report(*node, json{{"kind", "driver_exited"}, {"job", id}, {"attempt", 1}, {"status", "signal 9"}});
    json again = next_order(*node);
    REQUIRE(again.is_object());
    CHECK(again["kind"] == "start_driver");
    CHECK(again["attempt"] == 2);
    json retried = api(head, "GET", "/api/v1/jobs/" + std::to_string(id));
    CHECK(retried["state"] == "PENDING");
    CHECK(retried["attempts"] == 2);
    CHECK(retried["message"].get<std::string>().find("attempt 1 failed: its driver was killed by signal 9") != std::string::npos);

    report(*node, json{{"kind", "driver_exited"}, {"job", id}, {"attempt", 2}, {"status", "exit 5"}});
    json failed = job_until(head, id, [](const json& j) { return j["state"] == "FAILED"; });
    CHECK(failed["exit_code"] == 5);
    CHECK(failed["ended_at"].is_number());
    CHECK(api(head, "GET", "/api/v1/status")["nodes"][0]["available"].get<std::string>().find("CPU=2") != std::string::npos);   // released

    // A driver that needs a GPU is told which (CUDA_VISIBLE_DEVICES, set by the daemon).
    const json gpu_job = api(head, "POST", "/api/v1/jobs", json{{"entrypoint", {"x"}}, {"entrypoint_resources", "CPU=1,GPU=1"}});
    json gpu_start = next_order(*node);
    REQUIRE(gpu_start.is_object());
    CHECK(gpu_start["job"] == gpu_job["id"]);
    REQUIRE(gpu_start["gpus"].size() == 1);
    CHECK(gpu_start["gpus"][0].get<int>() < 2);
    report(*node, json{{"kind", "driver_exited"}, {"job", gpu_job["id"]}, {"attempt", 1}, {"status", "exit 0"}});
    CHECK(job_until(head, gpu_job["id"].get<std::uint64_t>(), [](const json& j) { return j["state"] == "SUCCEEDED"; })["state"] == "SUCCEEDED");

    auto logs = net::http_call("127.0.0.1", head.port(), "GET", "/api/v1/jobs/" + std::to_string(id) + "/logs", "", "secret",
                               std::chrono::seconds(5));
    CHECK(logs.body == "first line\n");
    // Following an ended job's log returns what it has and ends.
    std::string followed;
    auto res = net::http_stream("127.0.0.1", head.port(), "GET", "/api/v1/jobs/" + std::to_string(id) + "/logs?follow=1&offset=6",
                                "secret", [&](std::string_view p) { followed.append(p); return true; }, std::chrono::seconds(5));
    CHECK(res.status == 200);
    CHECK(followed == "line\n");

    // A log piece from a link that is no node's closes that link, and a malformed one too.
    auto driver = std::make_unique<net::HeadSession>(hub, head.link_address(), json{{"role", "driver"}}, std::chrono::seconds(5));
    driver->send_bytes(net::head_kind::kLog, net::encode_log(net::LogPiece{id, 0, "forged\n"}));
    node->send_bytes(net::head_kind::kLog, std::vector<char>{'x'});
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while ((!driver->ended() || !node->ended()) && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    CHECK(driver->ended());
    CHECK(node->ended());
    CHECK(net::http_call("127.0.0.1", head.port(), "GET", "/api/v1/jobs/" + std::to_string(id) + "/logs", "", "secret",
                         std::chrono::seconds(5)).body == "first line\n");

    // A job waiting for resources no node has, then stopped: never ordered to start.
    const json waiting = api(head, "POST", "/api/v1/jobs", json{{"entrypoint", {"x"}}, {"entrypoint_resources", "GPU=4"}});
    CHECK(waiting["message"].get<std::string>().find("waiting for a node with GPU=4") != std::string::npos);
    json stopped = api(head, "POST", "/api/v1/jobs/" + std::to_string(waiting["id"].get<std::uint64_t>()) + "/stop");
    CHECK(stopped["state"] == "STOPPED");
    CHECK(stopped["attempts"] == 0);
  }
  // Another head on the same store finds the jobs as they were.
  control::HeadConfig cfg;
  cfg.token = "secret";
  cfg.session_dir = dir.path;
  control::Head head(cfg);
  json j = api(head, "GET", "/api/v1/jobs/" + std::to_string(id));
  CHECK(j["state"] == "FAILED");
  CHECK(j["exit_code"] == 5);
  CHECK(j["name"] == "t");
  CHECK(api(head, "GET", "/api/v1/jobs")["jobs"].size() == 3);
  int status = 0;
  api(head, "DELETE", "/api/v1/jobs/" + std::to_string(id), nullptr, &status);
  CHECK(status == 200);
  api(head, "GET", "/api/v1/jobs/" + std::to_string(id), nullptr, &status);
  CHECK(status == 404);
}

TEST_CASE("a job package packs a directory, checks and unpacks it, and the node's cache keeps the most recently used") {
  TempDir dir("troupe-package");
  const fs::path src = fs::path(dir.path) / "src";
  fs::create_directories(src / "sub");
  std::ofstream(src / "a.txt") << "alpha";
  std::ofstream(src / "sub" / "b.bin") << std::string(1000, 'b');
  fs::create_symlink("../a.txt", src / "sub" / "link");
  fs::permissions(src / "a.txt", fs::perms::owner_exec, fs::perm_options::add);
  const std::string tar = dir.path + "/p.tar";
  control::pack_directory(src.string(), tar);
  CHECK(control::check_package(tar, 1 << 20).ok());
  auto small = control::check_package(tar, 100);
  CHECK(!small.ok());
  CHECK(small.error().message.find("unpacks to more than") != std::string::npos);
  // Into a directory reached through a symlink (as <temp>/session_latest/... is).
  fs::create_directories(fs::path(dir.path) / "real");
  fs::create_symlink(fs::path(dir.path) / "real", fs::path(dir.path) / "via");
  const fs::path out = fs::path(dir.path) / "via" / "out";
  auto unpacked = control::unpack_package(tar, out.string(), 1 << 20);
  REQUIRE_MESSAGE(unpacked.ok(), unpacked.error().message);
  std::ifstream a(out / "a.txt");
  std::string text;
  a >> text;
  CHECK(text == "alpha");
  CHECK(fs::file_size(out / "sub" / "b.bin") == 1000);
  CHECK(fs::read_symlink(out / "sub" / "link") == "../a.txt");
  CHECK((fs::status(out / "a.txt").permissions() & fs::perms::owner_exec) != fs::perms::none);
  // The same directory packs to the same bytes: its digest names it.
  const std::string again = dir.path + "/q.tar";
  control::pack_directory(src.string(), again);
  std::ifstream x(tar, std::ios::binary), y(again, std::ios::binary);
  CHECK(std::string(std::istreambuf_iterator<char>(x), {}) == std::string(std::istreambuf_iterator<char>(y), {}));
  // A file that is no archive, and a symlink out of the directory, are refused when packing or checking.
  std::ofstream(dir.path + "/junk.tar") << "not an archive at all";
  CHECK(!control::check_package(dir.path + "/junk.tar", 1 << 20).ok());
  fs::create_symlink("../../outside", src / "sub" / "out");
  CHECK_THROWS(control::pack_directory(src.string(), dir.path + "/r.tar"));
  fs::remove(src / "sub" / "out");
  // The node daemon's marker name is its own: a package with that entry (a symlink there would
  // have the daemon write through it) is refused.
  fs::create_symlink("a.txt", src / control::kUnpackedMarker);
  control::pack_directory(src.string(), dir.path + "/m.tar");
  auto marker = control::check_package(dir.path + "/m.tar", 1 << 20);
  CHECK(!marker.ok());
  CHECK(marker.error().message.find(control::kUnpackedMarker) != std::string::npos);
  fs::remove(src / control::kUnpackedMarker);
  // gzip'd archives are read (in process); other filters (some run external programs) are not.
  const std::string gz = dir.path + "/p.tar.gz";
  REQUIRE(std::system(("gzip -c " + tar + " > " + gz).c_str()) == 0);
  CHECK(control::check_package(gz, 1 << 20).ok());
  const std::string bz = dir.path + "/p.tar.bz2";
  if (std::system(("bzip2 -c " + tar + " > " + bz + " 2>/dev/null").c_str()) == 0) CHECK(!control::check_package(bz, 1 << 20).ok());

  control::PackageCache cache(dir.path + "/cache", 2500);
  for (const char* name : {"one", "two", "three"}) {
    const std::string f = dir.path + "/" + name;
    std::ofstream(f) << std::string(1000, 'x');
    cache.add(name, f);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));   // distinct use times
    if (std::string(name) == "two") CHECK(cache.has("one"));   // used: now newer than "two"
  }
  CHECK(cache.has("three"));
  CHECK(cache.has("one"));
  CHECK(!cache.has("two"));   // the least recently used went past the cap
  // What is in use stays past the cap (the head's packages of live jobs).
  const std::string four = dir.path + "/four";
  std::ofstream(four) << std::string(1000, 'x');
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  cache.has("one");   // "three" is now the least recently used
  cache.add("four", four, [](const std::string& d) { return d == "three"; });
  CHECK(cache.has("three"));
  CHECK(cache.has("four"));
  CHECK(!cache.has("one"));
}

TEST_CASE("freed room goes to the elastic group furthest below its target, across two drivers (the deficit rule at the head)") {
  TempDir dir("troupe-elastic-head");
  control::HeadConfig cfg;
  cfg.token = "secret";
  cfg.session_dir = dir.path;
  control::Head head(cfg);
  net::LinkHub hub("secret", net::self_identity("test"));
  auto node1 = std::make_unique<net::HeadSession>(hub, head.link_address(), json{{"role", "node"}, {"resources", "CPU=2"}},
                                                  std::chrono::seconds(5));
  auto a_driver = std::make_unique<net::HeadSession>(hub, head.link_address(), json{{"role", "driver"}}, std::chrono::seconds(5));
  auto b_driver = std::make_unique<net::HeadSession>(hub, head.link_address(), json{{"role", "driver"}}, std::chrono::seconds(5));
  auto member = [](std::uint64_t owner) {
    return json{{"type", "T"}, {"ctor_signature", ""}, {"ctor_args", ""}, {"binary", "/bin/true"}, {"resources", "CPU=1"},
                {"owner", owner}};
  };
  // Job A's group wants 4 and gets the 2 CPUs there are; job B's wants 2 and gets none.
  const json a = api(head, "POST", "/api/v1/elastic_groups",
                     json{{"name", "a"}, {"min", 1}, {"max", 4}, {"member", member(a_driver->welcome()["owner"])}});
  const json b = api(head, "POST", "/api/v1/elastic_groups",
                     json{{"name", "b"}, {"min", 1}, {"max", 2}, {"member", member(b_driver->welcome()["owner"])}});
  REQUIRE(a.contains("id"));
  REQUIRE(b.contains("id"));
  auto placed = [&](const json& g, std::uint64_t node) {
    int n = 0;
    const json status = api(head, "GET", "/api/v1/status");   // kept: the loop must not range over a dead temporary
    for (const auto& x : status["actors"]) {
      if (x["elastic_group"] == g["id"] && x["state"] != "dead" && x["node"] == node) ++n;
    }
    return n;
  };
  CHECK(placed(a, 1) == 2);
  CHECK(placed(b, 1) == 0);
  // Two CPUs come free on a new node: A is 2 below its target, B 2 below its own; by the deficit
  // rule each gets one (in id order A, created first, would have taken both).
  auto node2 = std::make_unique<net::HeadSession>(hub, head.link_address(), json{{"role", "node"}, {"resources", "CPU=2"}},
                                                  std::chrono::seconds(5));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (placed(a, 2) + placed(b, 2) < 2 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  CHECK(placed(a, 2) == 1);
  CHECK(placed(b, 2) == 1);
  // A bad scale is refused; B's driver leaving takes its group with it (JOB-1), and A gets the room.
  int status = 0;
  api(head, "POST", "/api/v1/elastic_groups/" + std::to_string(b["id"].get<std::uint64_t>()) + "/scale",
      json{{"replicas", 5}}, &status);
  CHECK(status == 400);
  b_driver->close();
  const auto again = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (placed(a, 2) < 2 && std::chrono::steady_clock::now() < again) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  CHECK(placed(a, 2) == 2);
  CHECK(placed(b, 2) == 0);
  CHECK(api(head, "GET", "/api/v1/status")["elastic_groups"].size() == 1);
}
