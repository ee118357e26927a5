// The head in-process: its HTTP API and its links refuse bad tokens, bad bodies and bad messages
// with clear errors and keep what they stored; orders are pushed on the links; the SQLite store round-trips records, refuses stores it did not write, and a
// head started on another head's store finds its nodes, actors and groups.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "head_state.hpp"   // white-box: the head's state machine alone
#include "support/temp_dir.hpp"
#include "troupe/control/head.hpp"
#include "troupe/control/store.hpp"
#include "troupe/net/head_link.hpp"
#include "troupe/net/http.hpp"
#include "troupe/net/link.hpp"

using nlohmann::json;
namespace control = troupe::control;
namespace net = troupe::net;

namespace {

using test_support::TempDir;

control::HeadConfig head_config(const std::string& session_dir) {
  control::HeadConfig c;
  c.token = "secret";
  c.session_dir = session_dir;
  return c;
}

net::HttpResponse call(const control::Head& h, const std::string& method, const std::string& target,
                       const std::string& body, const std::string& token = "secret") {
  return net::http_call("127.0.0.1", h.port(), method, target, body, token, std::chrono::seconds(5));
}

// A node daemon's or a worker's side of its link to the head, without the process around it.
struct LinkPeer {
  explicit LinkPeer(const std::string& token = "secret") : hub(token, net::self_identity("test")) {}
  std::unique_ptr<net::HeadSession> hello(const control::Head& h, const json& body) {
    return std::make_unique<net::HeadSession>(hub, h.link_address(), body, std::chrono::seconds(5));
  }
  std::unique_ptr<net::HeadSession> node(const control::Head& h, const std::string& resources, const std::string& hostname = "") {
    return hello(h, json{{"role", "node"}, {"address", "127.0.0.1"}, {"hostname", hostname}, {"resources", resources}});
  }
  net::LinkHub hub;
};

json status_of(const control::Head& h) { return json::parse(call(h, "GET", "/api/v1/status", "").body); }

// The first order pushed to `s` of `kind`, waiting up to 5 s; null if none came.
json order(net::HeadSession& s, const std::string& kind) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < deadline) {
    auto m = s.next(std::chrono::milliseconds(200));
    if (m && m->kind == net::head_kind::kOrder && m->body.value("kind", "") == kind) return m->body;
    if (m && m->kind == 0) return nullptr;
  }
  return nullptr;
}

// Waits up to 5 s for `pred` over the head's status.
template <class Pred>
bool status_until(const control::Head& h, Pred pred) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred(status_of(h))) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

// A plain TCP connection to 127.0.0.1:port, each recv bounded by `recv_timeout`, for requests no
// HTTP client sends (a header alone, one trickling in); -1 when it cannot connect.
int raw_connection(std::uint16_t port, std::chrono::microseconds recv_timeout) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in at{};
  at.sin_family = AF_INET;
  at.sin_port = htons(port);
  at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&at), sizeof at) != 0) {
    ::close(fd);
    return -1;
  }
  timeval tv{time_t(recv_timeout.count() / 1000000), suseconds_t(recv_timeout.count() % 1000000)};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

}  // namespace

TEST_CASE("the head refuses calls without the cluster token") {
  TempDir dir;
  control::Head head(head_config(dir.path));
  CHECK(call(head, "GET", "/api/v1/status", "", "").status == 401);
  CHECK(call(head, "GET", "/api/v1/status", "", "secrex").status == 401);
  auto ok = call(head, "GET", "/api/v1/status", "");
  CHECK(ok.status == 200);
  CHECK(json::parse(ok.body)["nodes"].empty());
  // A request without the token is answered once its header is in, its body never read: a header
  // announcing 60 MB and no body gets its 401 now (the server no longer waits for what it would
  // refuse: up to 120 s for the next byte, and 64 MiB kept per connection).
  const int fd = raw_connection(head.port(), std::chrono::seconds(5));
  REQUIRE(fd >= 0);
  const std::string request = "POST /api/v1/actors HTTP/1.1\r\nHost: x\r\nContent-Length: 60000000\r\n\r\n";
  REQUIRE(::send(fd, request.data(), request.size(), MSG_NOSIGNAL) == ssize_t(request.size()));
  char answer[256] = {};
  const auto got = ::recv(fd, answer, sizeof answer - 1, 0);
  ::close(fd);
  REQUIRE(got > 0);
  CHECK(std::string(answer).rfind("HTTP/1.1 401", 0) == 0);
}

TEST_CASE("an HTTP request's header must be in by its deadline, however slowly it trickles, and a whole one is served") {
  net::HttpServer server("127.0.0.1", 0, [](const net::HttpRequest&) { return net::HttpResponse{200, "{}"}; }, {}, "",
                         std::chrono::milliseconds(300));
  const int fd = raw_connection(server.port(), std::chrono::milliseconds(100));
  REQUIRE(fd >= 0);
  const auto start = std::chrono::steady_clock::now();
  // A header begun, then a byte every 100 ms: each read gets its byte in time, the whole never
  // ends. The server must close it near its 300 ms deadline; a bound on each read alone never would.
  const std::string part = "GET /x HTTP/1.1\r\nX-Slow: ";
  REQUIRE(::send(fd, part.data(), part.size(), MSG_NOSIGNAL) == ssize_t(part.size()));
  bool closed = false;
  while (!closed && std::chrono::steady_clock::now() - start < std::chrono::seconds(4)) {
    const char byte = 'x';
    char back = 0;
    if (::send(fd, &byte, 1, MSG_NOSIGNAL) != 1) { closed = true; break; }
    const auto got = ::recv(fd, &back, 1, 0);   // waits the 100 ms tick
    closed = got == 0 || (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
    REQUIRE(got <= 0);   // never answered
  }
  const auto waited = std::chrono::steady_clock::now() - start;
  ::close(fd);
  CHECK(closed);
  CHECK(waited < std::chrono::seconds(2));
  CHECK(net::http_call("127.0.0.1", server.port(), "GET", "/x", "", "", std::chrono::seconds(5)).status == 200);
}

TEST_CASE("bad bodies and bad hellos are refused with a reason and change nothing") {
  TempDir dir;
  control::Head head(head_config(dir.path));
  LinkPeer peer;
  auto good = peer.node(head, "CPU=2");
  CHECK(good->welcome().value("node_id", std::uint64_t{0}) == 1);
  for (const json& hello : {json{{"role", "node"}, {"resources", "CPU=two"}}, json{{"role", "node"}, {"resources", "GPU=1.5,GPU=1"}},
                            json{{"role", "node"}}, json{{"role", "mayor"}}, json{{"resources", "CPU=1"}},
                            json{{"role", "worker"}, {"worker_id", 99}, {"gateway", "127.0.0.1:1"}}}) {
    CAPTURE(hello.dump());
    try {
      (void)peer.hello(head, hello);
      FAIL("the head welcomed a bad hello");
    } catch (const troupe::ErrorException& e) {
      CHECK(e.code() == troupe::NetCode::Refused);
      CHECK(std::string(e.what()).find("the head refused") != std::string::npos);
    }
  }
  LinkPeer wrong("secrex");
  CHECK_THROWS_AS(wrong.node(head, "CPU=1"), troupe::ErrorException);   // the handshake fails: no hello is read
  auto bad_actor = call(head, "POST", "/api/v1/actors", R"({"type":"X","ctor_signature":"s","ctor_args":"00","binary":"/bin/true","resources":"CPU=-1"})");
  CHECK(bad_actor.status == 400);
  CHECK(call(head, "POST", "/api/v1/actors", R"({"type":"X"})").status == 400);   // fields missing
  CHECK(call(head, "POST", "/api/v1/actors", "[1,2]").status == 400);
  CHECK(call(head, "POST", "/api/v1/actors", "{").status == 400);
  CHECK(call(head, "GET", "/api/v1/actors/notanumber", "").status == 404);
  CHECK(call(head, "GET", "/api/v1/nowhere", "").status == 404);
  CHECK(call(head, "POST", "/api/v1/nodes", R"({"resources":"CPU=2"})").status == 404);   // nodes join on a link
  // An owner is a driver's open link (JOB-1): a spawn or a group naming another is refused.
  CHECK(call(head, "POST", "/api/v1/actors", R"({"type":"X","ctor_signature":"s","ctor_args":"","binary":"/bin/true","owner":77})").status == 409);
  CHECK(call(head, "POST", "/api/v1/placement_groups", R"({"bundles":["CPU=1"],"owner":77})").status == 409);
  CHECK(call(head, "POST", "/api/v1/placement_groups", R"({"bundles":["CPU=1"],"owner":"me"})").status == 400);
  // A hosted actor (a process's own, callable from others): type, gateway and a linked owner.
  CHECK(call(head, "POST", "/api/v1/actors/hosted", R"({"type":"X","gateway":"127.0.0.1:9","owner":77})").status == 409);
  CHECK(call(head, "POST", "/api/v1/actors/hosted", R"({"type":"X","gateway":"127.0.0.1:9"})").status == 400);
  CHECK(call(head, "POST", "/api/v1/actors/hosted", R"({"type":"X","gateway":"nowhere","owner":1})").status == 400);
  CHECK(call(head, "POST", "/api/v1/actors/hosted", R"({"type":"","gateway":"127.0.0.1:9","owner":1})").status == 400);
  CHECK(call(head, "POST", "/api/v1/actors/hosted", R"({"type":7,"gateway":"127.0.0.1:9","owner":1})").status == 400);
  CHECK(call(head, "POST", "/api/v1/actors/hosted", "[]").status == 400);
  // JSON nested a million deep (a field of the wrong type whose text an error message once
  // printed, recursively, overflowing the stack) is refused by its depth; 64 levels are only a
  // wrong type, named by its type.
  auto deep = call(head, "POST", "/api/v1/actors", R"({"type":)" + std::string(1000000, '[') + std::string(1000000, ']') + "}");
  CHECK(deep.status == 400);
  CHECK(deep.body.find("deeper than 64") != std::string::npos);
  auto nested = call(head, "POST", "/api/v1/actors", R"({"type":)" + std::string(63, '[') + std::string(63, ']') + "}");
  CHECK(nested.status == 400);
  CHECK(nested.body.find("field 'type' has the wrong type: array") != std::string::npos);
  // A spec that could not fit an order to a node is refused before anything is stored (413).
  auto huge = call(head, "POST", "/api/v1/actors",
                   R"({"type":"X","ctor_signature":"s","binary":"/bin/true","ctor_args":")" + std::string(17u << 20, '0') + "\"}");
  CHECK(huge.status == 413);
  // A path that is not UTF-8 is named in the 404 (as U+FFFD), not a 500.
  auto odd = call(head, "GET", "/nowhere%FF", "");
  CHECK(odd.status == 404);
  CHECK(odd.body.find("/nowhere\xef\xbf\xbd") != std::string::npos);
  auto status = status_of(head);
  CHECK(status["nodes"].size() == 1);
  CHECK(status["nodes"][0].value("state", "") == "alive");
  CHECK(status["actors"].empty());
  CHECK_FALSE(good->ended());
}

TEST_CASE("orders are pushed on a node's link, a bad message closes only its link, and a node whose link ends is dead") {
  TempDir dir;
  control::Head head(head_config(dir.path));
  LinkPeer peer;
  auto node = peer.node(head, "CPU=2");
  const auto node_id = node->welcome().at("node_id").get<std::uint64_t>();
  auto spawned = json::parse(call(head, "POST", "/api/v1/actors",
      R"({"type":"T","ctor_signature":"s","ctor_args":"","binary":"/bin/true","resources":"CPU=1"})").body);
  REQUIRE(spawned.contains("actor_id"));
  json start = order(*node, "start_worker");   // pushed: the node never asked
  REQUIRE_FALSE(start.is_null());
  CHECK(start.value("binary", "") == "/bin/true");
  const auto worker = start.at("worker_id").get<std::uint64_t>();

  // The worker says hello and is pushed its spawn order; its readiness reaches the actor's record.
  auto w = peer.hello(head, json{{"role", "worker"}, {"worker_id", worker}, {"gateway", "127.0.0.1:5"}, {"pid", 5}});
  json spawn = order(*w, "spawn");
  REQUIRE_FALSE(spawn.is_null());
  CHECK(spawn.at("actor_id") == spawned.at("actor_id"));
  REQUIRE(w->send(net::head_kind::kEvents, json{{"events", json::array({json{{"kind", "actor_ready"},
      {"actor_id", spawn.at("actor_id")}, {"incarnation", spawn.at("incarnation")}}})}}));
  CHECK(status_until(head, [](const json& st) { return st["actors"][0].value("state", "") == "alive"; }));

  // Messages that are no control message, or of a kind the head does not take, close their link only.
  auto raw = peer.hub.connect(head.link_address(), [](net::Link&, char, std::vector<char>&) {}, [](net::Link&, net::LinkEnd, const std::string&) {},
                              std::chrono::seconds(5));
  const std::string junk = "not json";
  REQUIRE(raw->send('H', junk.data(), junk.size()));
  auto raw2 = peer.hub.connect(head.link_address(), [](net::Link&, char, std::vector<char>&) {}, [](net::Link&, net::LinkEnd, const std::string&) {},
                               std::chrono::seconds(5));
  REQUIRE(raw2->send('Z', std::vector<char>{'{', '}'}));
  REQUIRE(w->send(net::head_kind::kEvents, json{{"events", "all of them"}}));   // a bad events body: the worker's link
  for (int i = 0; i < 250 && !(raw->closed() && raw2->closed() && w->ended()); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK(raw->closed());
  CHECK(raw2->closed());
  CHECK(w->ended());
  CHECK_FALSE(node->ended());
  CHECK(status_of(head)["nodes"][0].value("state", "") == "alive");

  // The worker's link ended: the head orders its node to kill it, and restarts nothing (max_restarts 0).
  json kill = order(*node, "kill_worker");
  REQUIRE_FALSE(kill.is_null());
  CHECK(kill.at("worker_id") == worker);
  CHECK(status_until(head, [](const json& st) { return st["actors"][0].value("state", "") == "dead"; }));

  node->close();   // the daemon is gone: its node is dead at once, not after node_timeout
  CHECK(status_until(head, [&](const json& st) {
    return st["nodes"][0].value("id", std::uint64_t{0}) == node_id && st["nodes"][0].value("state", "") == "dead";
  }));
}

TEST_CASE("the head writes the nodes it registers to its SQLite store, which round-trips records byte-exact") {
  TempDir dir;
  {
    LinkPeer peer;
    auto head = std::make_unique<control::Head>(head_config(dir.path));
    auto node = peer.node(*head, "CPU=2");
    head.reset();   // before the link ends: the node is stored alive
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
  a.spec.owner = 11;
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
  CHECK(actors[0].spec.owner == 11);
  control::GroupRecord g;
  g.id = 7;
  g.strategy = troupe::placement::Strategy::kSpread;
  g.bundles = {*troupe::placement::Resources::parse("CPU=1"), *troupe::placement::Resources::parse("GPU=1")};
  g.bundle_nodes = {3, 0};
  g.owner = 11;
  store->put_group(g);
  auto groups = store->groups();
  REQUIRE(groups.size() == 1);
  CHECK(groups[0].strategy == troupe::placement::Strategy::kSpread);
  CHECK(groups[0].bundles == g.bundles);
  CHECK(groups[0].bundle_nodes == g.bundle_nodes);
  CHECK(groups[0].owner == 11);
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
    CHECK_THROWS_AS(control::Head(head_config(dir.path)), troupe::ErrorException);
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

TEST_CASE("a head starts on a store whose jobs kept submission ids that new submits may not use") {
  TempDir dir;
  {   // as an earlier version stored it: a submission id of digits alone
    auto store = control::open_sqlite_store((std::filesystem::path(dir.path) / "store.db").string());
    control::JobRecord j;
    j.id = 1;
    j.spec.entrypoint = {"true"};
    j.spec.submission_id = "42";
    j.state = control::JobState::Succeeded;
    store->put_job(j);
  }
  control::Head head(head_config(dir.path));
  auto old = call(head, "GET", "/api/v1/jobs/42", "");   // no job 42: the submission id names job 1
  REQUIRE(old.status == 200);
  CHECK(json::parse(old.body).value("id", std::uint64_t{0}) == 1);
  CHECK(json::parse(old.body).value("submission_id", "") == "42");
  CHECK(call(head, "POST", "/api/v1/jobs", R"({"entrypoint":["true"],"submission_id":"43"})").status == 400);
}

TEST_CASE("a head started on the store another head wrote finds the same nodes, actors and groups") {
  TempDir dir;
  json before;
  std::uint64_t last_actor = 0;
  std::uint64_t next_worker_seen = 0;
  {
    LinkPeer peer;
    auto owner = std::make_unique<control::Head>(head_config(dir.path));
    control::Head& head = *owner;
    auto n1 = peer.node(head, "CPU=2", "a");
    auto n2 = peer.node(head, "CPU=2", "b");
    REQUIRE(n1->welcome().at("node_id") != n2->welcome().at("node_id"));
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
    auto w = peer.hello(head, json{{"role", "worker"}, {"worker_id", worker}, {"gateway", "127.0.0.1:4242"}, {"pid", 4242}});
    REQUIRE(w->send(net::head_kind::kEvents, json{{"events", json::array({json{{"kind", "actor_ready"}, {"actor_id", a1},
                                                  {"incarnation", a1_view.at("incarnation")}}})}}));
    REQUIRE(status_until(head, [&](const json& st) {
      for (const auto& a : st["actors"]) if (a.value("id", std::uint64_t{0}) == a1) return a.value("state", "") == "alive";
      return false;
    }));
    before = status_of(head);
    next_worker_seen = worker;
    owner.reset();   // before the links end: what it stored is what it knew
  }
  control::Head head(head_config(dir.path));
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
  LinkPeer again;   // the loaded worker is known: it may say hello (live reconnection comes with head restart)
  auto w = again.hello(head, json{{"role", "worker"}, {"worker_id", next_worker_seen}, {"gateway", "127.0.0.1:4242"}, {"pid", 4242}});
  CHECK(w->welcome().value("state", "") == "alive");

  // No daemon links again: each loaded node dies at node_timeout (2.5 s) after the load.
  CHECK(status_until(head, [](const json& st) {
    for (const auto& n : st["nodes"]) if (n.value("state", "") != "dead") return false;
    return true;
  }));
}

TEST_CASE("a placement group's GET with wait_ms is answered when the group's state changes, not at the wait") {
  TempDir dir;
  control::Head head(head_config(dir.path));
  auto created = json::parse(call(head, "POST", "/api/v1/placement_groups", R"({"bundles":["GPU=1"],"strategy":"PACK"})").body);
  REQUIRE(created.value("state", "") == "PENDING");   // no node has a GPU yet
  const auto target = "/api/v1/placement_groups/" + std::to_string(created.at("id").get<std::uint64_t>());
  auto t0 = std::chrono::steady_clock::now();
  auto still = json::parse(call(head, "GET", target + "?wait_ms=300", "").body);
  CHECK(still.value("state", "") == "PENDING");   // nothing changed: answered at the wait
  CHECK(std::chrono::steady_clock::now() - t0 >= std::chrono::milliseconds(250));
  CHECK(call(head, "GET", target + "?wait_ms=soon", "").status == 400);

  LinkPeer peer;
  std::unique_ptr<net::HeadSession> node;
  std::thread joiner([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    node = peer.node(head, "CPU=2,GPU=1");
  });
  t0 = std::chrono::steady_clock::now();
  auto ready = json::parse(call(head, "GET", target + "?wait_ms=5000", "").body);
  const auto took = std::chrono::steady_clock::now() - t0;
  joiner.join();
  CHECK(ready.value("state", "") == "CREATED");
  CHECK(took < std::chrono::seconds(3));   // woken by the node's arrival, not the 5 s wait
}

namespace {

// A head's state on a fresh store, with two nodes of 4 CPUs.
struct TwoNodes {
  TempDir dir{"troupe-head-state"};
  std::unique_ptr<troupe::control::Store> store = troupe::control::open_sqlite_store(dir.path + "/store.db");
  troupe::control::HeadState h{*store};
  std::uint64_t add_node() {
    troupe::control::NodeRecord r;
    r.total = *troupe::placement::Resources::parse("CPU=4");
    return h.register_node(r).value();
  }
  std::uint64_t n1 = add_node(), n2 = add_node();
  // An actor of the group's bundle 0.
  static troupe::control::SpawnSpec in_bundle(std::uint64_t group, bool colocate, int max_restarts, const char* cpu) {
    troupe::control::SpawnSpec s;
    s.type = "T";
    s.binary = "/bin/true";
    s.resources = *troupe::placement::Resources::parse(cpu);
    s.placement_group = group;
    s.bundle_index = 0;
    s.colocate = colocate;
    s.max_restarts = max_restarts;
    return s;
  }
  // One, made running.
  const troupe::control::ActorRecord* running(std::uint64_t group, bool colocate, int max_restarts, const char* cpu) {
    const auto* a = h.create_actor(in_bundle(group, colocate, max_restarts, cpu)).value();
    REQUIRE(a->worker != 0);
    REQUIRE(h.worker_ready(a->worker, "127.0.0.1:1", 1).ok());
    REQUIRE(h.actor_events(a->worker, {troupe::control::ActorEvent{a->id, a->incarnation, troupe::control::ActorEvent::Kind::Ready, ""}}).ok());
    return h.actor(a->id);
  }
  std::uint64_t group() {
    troupe::placement::PlacementGroupSpec spec;
    spec.bundles = {*troupe::placement::Resources::parse("CPU=1")};
    return h.create_group(spec).value().id;
  }
};

}  // namespace

// Its bundle stays reserved on the draining node until the node goes: a restart landed there
// again, its new worker was then moved in turn, and with unlimited restarts the drain never
// returned (the head hung under its lock).
TEST_CASE("draining a node leaves a placement group's actor in place until the deadline, and lists it then, with unlimited restarts too") {
  TwoNodes t;
  const auto* a = t.running(t.group(), false, -1, "CPU=1");
  const auto id = a->id, node = a->node, worker = a->worker;
  REQUIRE(t.h.drain_node(node, std::chrono::milliseconds(50)).ok());
  a = t.h.actor(id);
  CHECK(a->restarts == 0);
  CHECK(a->worker == worker);
  CHECK(a->state == troupe::control::ActorState::Alive);
  t.h.advance_drains(std::chrono::steady_clock::now() + std::chrono::seconds(1));
  const auto& left = t.h.nodes().find(node)->rec.drain_left;
  REQUIRE(left.size() == 1);
  CHECK(left[0].find("placement group") != std::string::npos);
}

// Its worker was told to exit when its last actor went: an actor colocated into the same bundle
// afterwards went to that worker, which exited under it (the actor buried, "no restarts left").
TEST_CASE("an actor colocated into a bundle whose worker was told to exit gets a worker of its own") {
  TwoNodes t;
  const auto g = t.group();
  const auto* first = t.running(g, true, 0, "CPU=0.5");
  const auto w = first->worker;
  (void)t.h.take_worker_commands(w);
  REQUIRE(t.h.kill_actor(first->id, "test").ok());
  const auto* second = t.h.create_actor(TwoNodes::in_bundle(g, true, 0, "CPU=0.5")).value();
  CHECK(second->worker != w);
  for (const auto& cmd : t.h.take_worker_commands(w)) CHECK(cmd.to_json().dump().find("spawn") == std::string::npos);
  REQUIRE(t.h.worker_exited(first->node, w, "exit 0").ok());
  CHECK(t.h.actor(second->id)->state != troupe::control::ActorState::Dead);
}

// A member leaving a draining node that dies before the member reports drained: it restarted
// elsewhere still marked leaving, counted live by the head and skipped by every caller, so the
// group stayed a member short for good. It is buried, and its group starts another.
TEST_CASE("an elastic member leaving a draining node that dies first is replaced, not restarted as leaving") {
  TwoNodes t;
  troupe::control::ElasticGroupRecord g;
  g.name = "e";
  g.member.type = "T";
  g.member.binary = "/bin/true";
  g.member.resources = *troupe::placement::Resources::parse("CPU=4");
  g.member.max_restarts = 3;
  const auto* eg = t.h.create_elastic(g).value();
  const auto gid = eg->id, first = eg->members.at(0);
  const auto* a = t.h.actor(first);
  REQUIRE(t.h.worker_ready(a->worker, "127.0.0.1:1", 1).ok());
  REQUIRE(t.h.actor_events(a->worker, {troupe::control::ActorEvent{first, a->incarnation, troupe::control::ActorEvent::Kind::Ready, ""}}).ok());
  const auto node = a->node;
  REQUIRE(t.h.drain_node(node, std::chrono::seconds(30)).ok());
  CHECK(t.h.actor(first)->leaving);
  REQUIRE(t.h.node_gone(node, "preempted").ok());
  CHECK(t.h.actor(first)->state == troupe::control::ActorState::Dead);
  const auto& members = t.h.elastic_groups().at(gid).members;
  REQUIRE(members.size() == 1);
  CHECK(members[0] != first);
  CHECK_FALSE(t.h.actor(members[0])->leaving);
}
