// A real cluster on 127.0.0.1: head and daemons through the CLI, actors in worker processes,
// calls from the driver and between actors, a 256 MiB tensor between workers of two daemons.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <iostream>
#include <random>
#include <set>
#include <sstream>
#include <thread>
#include <iterator>

#include "cluster_harness.hpp"
#include "support/helper_main.hpp"
#include "support/skip.hpp"
#include "support/temp_dir.hpp"
#include "test_actors.hpp"
#include "troupe/ids.hpp"
#include "troupe/proc_file.hpp"
#include "troupe/share_thread.hpp"

using namespace std::chrono_literals;
using troupe::ErrorCode;

using nlohmann::json;

namespace {

troupe::Runtime connect(const itest::Cluster& c) { return itest::connect(c, 60s); }

}  // namespace

TEST_CASE("actors on two daemons answer the driver and each other, and move 256 MiB bit-identical") {
  itest::Cluster cluster;
  cluster.add_node("CPU=2,node_a=1");
  cluster.add_node("CPU=2,node_b=1");
  auto rt = connect(cluster);
  auto a = rt.spawn<Store>(troupe::Options{}.name("a").resources("node_a=1"), 10);
  auto b = rt.spawn<Store>(troupe::Options{}.name("b").resources("node_b=1"), 100);
  REQUIRE(a.ready().wait_for(30s));
  REQUIRE(b.ready().wait_for(30s));
  CHECK(a.ready().result().ok());
  CHECK(a.call(&Store::add, 5).get() == 15);
  CHECK(b.call(&Store::get).get() == 100);
  int pid_a = a.call(&Store::pid).get(), pid_b = b.call(&Store::pid).get();
  CHECK(pid_a != pid_b);
  CHECK(pid_a != int(::getpid()));
  auto sa = cluster.actor(a.id()), sb = cluster.actor(b.id());
  CHECK(sa.value("node", std::uint64_t{0}) != sb.value("node", std::uint64_t{0}));   // different daemons
  CHECK(sa.value("state", "") == "alive");

  // Actor to actor, across processes.
  CHECK(a.call(&Store::add_via, b, 7).get() == 107);
  CHECK(b.call(&Store::get).get() == 107);
  // A method's own Error crosses the process boundary intact: domain, code and message.
  auto refused = a.call(&Store::refuse, std::string("torn version")).result();
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.error().code == troupe::WeightCode::Checksum);
  CHECK(refused.error().message == "torn version");

  // 256 MiB made in b's process, pulled by a's process over the data plane.
  const std::int64_t kBytes = 256ll << 20;
  auto pulled = a.with_timeout(120s).call(&Store::pull_checksum, b, kBytes, 3).get();
  auto made = b.call(&Store::checksum_of_last).get();
  CHECK(pulled == made);
  // And to the driver: 16 MiB back, checked here.
  auto t = b.call(&Store::make, std::int64_t(16 << 20), 4).get();
  CHECK(fnv1a(t.data, t.nbytes()) == b.call(&Store::checksum_of_last).get());
}

TEST_CASE("calls in flight together over a link are answered in submission order, worker to worker too") {
  itest::Cluster cluster;
  cluster.add_node("CPU=2");
  troupe::RuntimeConfig cfg;
  cfg.address = cluster.address();
  cfg.token = cluster.token();
  cfg.remote_call_timeout = 60s;
  auto rt = troupe::Runtime::create(cfg).value();
  auto a = rt.spawn<Store>(troupe::Options{}.name("a").process(true), 10);
  auto b = rt.spawn<Store>(troupe::Options{}.name("b").process(true), 100);
  REQUIRE(a.ready().wait_for(30s));
  REQUIRE(b.ready().wait_for(30s));
  std::vector<troupe::Future<int>> adds;   // in flight together: answered in submission order
  for (int i = 1; i <= 50; ++i) adds.push_back(a.call(&Store::add, 1));
  for (int i = 0; i < 50; ++i) CHECK(adds[std::size_t(i)].get() == 11 + i);
  CHECK(a.call(&Store::add_via, b, 7).get() == 107);
  auto refused = a.call(&Store::refuse, std::string("torn version")).result();
  CHECK(refused.error().code == troupe::WeightCode::Checksum);
  CHECK(refused.error().message == "torn version");
  auto t = b.call(&Store::make, std::int64_t(4 << 20), 9).get();   // a result tensor over UCX
  CHECK(fnv1a(t.data, t.nbytes()) == b.call(&Store::checksum_of_last).get());
  // One of 300 KiB, past a socket's inline limit and within a lane's (inline by the lane: the peers
  // test "tensors up to kLaneInlineMaxBytes go in the message"), arrives whole both ways.
  auto mid = b.call(&Store::make, std::int64_t(300 << 10), 5).get();
  CHECK(mid.nbytes() == std::size_t(300 << 10));
  CHECK(fnv1a(mid.data, mid.nbytes()) == b.call(&Store::checksum_of_last).get());
  CHECK(a.call(&Store::checksum, mid).get() == fnv1a(mid.data, mid.nbytes()));
}

TEST_CASE("a worker actor's deferred reply crosses the link when its future completes, and fails if the actor is killed") {
  itest::Cluster cluster;
  cluster.add_node("CPU=2");
  auto rt = connect(cluster);
  auto g = rt.spawn<Gate>(troupe::Options{}.process(true));
  REQUIRE(g.ready().wait_for(30s));
  auto w = g.call(&Gate::wait);
  auto v = g.call(&Gate::wait_void);
  CHECK(g.call(&Gate::waiters).get() == 2);   // the worker serves calls while two replies wait
  CHECK_FALSE(w.ready());
  CHECK(g.call(&Gate::open, 42).get() == 2);
  CHECK(w.get() == 42);
  CHECK(v.wait_for(10s));
  CHECK(v.result().ok());
  CHECK(g.call(&Gate::open_later, 7, 20).get() == 7);   // from a thread of the worker's
  auto refused = g.call(&Gate::wait);
  CHECK(g.call(&Gate::refuse, std::string("no")).get() == 1);
  CHECK(refused.result().error().code == ErrorCode::Cancelled);
  CHECK(refused.result().error().message == "no");
  auto orphan = g.call(&Gate::wait);
  CHECK(g.call(&Gate::waiters).get() == 1);
  rt.kill(g);
  REQUIRE(orphan.wait_for(10s));
  CHECK(orphan.result().error().code == ErrorCode::ActorDied);
}

TEST_CASE("a driver's in-process actor passed to worker actors is called there by its cluster id, until it is killed") {
  itest::Cluster cluster;
  cluster.add_node("CPU=2");
  auto rt = connect(cluster);
  auto local = rt.spawn<Store>(troupe::Options{}, 10);   // in this process
  auto a = rt.spawn<Store>(troupe::Options{}.process(true), 1);
  auto b = rt.spawn<Store>(troupe::Options{}.process(true), 2);
  CHECK(a.call(&Store::add_via, local, 5).get() == 15);
  CHECK(b.call(&Store::add_via, local, 1).get() == 16);   // the same actor, from another process
  CHECK(local.call(&Store::get).get() == 16);
  CHECK(local.call(&Store::pid).get() == int(::getpid()));

  // The head numbered it once and knows where it is called: this process, no node, owned by
  // this driver.
  std::vector<nlohmann::json> hosted;
  for (const auto& x : cluster.status().value("actors", nlohmann::json::array())) {
    if (x.value("pid", 0) == int(::getpid())) hosted.push_back(x);
  }
  REQUIRE(hosted.size() == 1);
  CHECK(hosted[0].value("state", "") == "alive");
  CHECK(hosted[0].value("node", std::uint64_t{1}) == 0);
  CHECK(hosted[0].value("owner", std::uint64_t{0}) != 0);
  CHECK(hosted[0].value("type", "") == "Store");
  const auto cluster_id = hosted[0].value("id", std::uint64_t{0});
  CHECK(cluster_id >= troupe::kClusterActorBase);

  rt.kill(local);   // the head is told; a worker that calls it then learns it is dead
  auto f = a.call(&Store::add_via, local, 1);
  REQUIRE(f.wait_for(20s));
  REQUIRE_FALSE(f.result().ok());
  CHECK(f.result().error().code == ErrorCode::MethodFailed);   // add_via's own call failed
  CHECK(f.result().error().message.find("ActorDied") != std::string::npos);
  CHECK(cluster.actor(cluster_id).value("state", "") == "dead");
}

TEST_CASE("a wrong token is refused: no join, no status, no call") {
  itest::Cluster cluster;
  int st = 0;
  std::string out = cluster.cli({"start", "--address", cluster.address(), "--token", "not-the-token",
                                 "--resources", "CPU=1"}, &st);
  CHECK(st != 0);
  CHECK(out.find("token") != std::string::npos);
  out = cluster.cli({"status", "--address", cluster.address(), "--token", "wrong"}, &st);
  CHECK(st != 0);
  CHECK(out.find("token") != std::string::npos);
  CHECK(cluster.status().value("nodes", nlohmann::json::array()).size() == 1);   // only the head's own
  troupe::RuntimeConfig cfg;
  cfg.address = cluster.address();
  cfg.token = "wrong";
  auto refused = troupe::Runtime::create(cfg);   // a value, not a throw
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.error().message.find("token") != std::string::npos);
  // The refusals are logged.
  auto logs = itest::run({"/bin/sh", "-c", "cat " + cluster.temp_dir() + "/session_latest/logs/head.log"});
  CHECK(logs.output.find("refused") != std::string::npos);
}

TEST_CASE("troupe start raises its daemons' soft limit on open files to the hard limit, at most 65536") {
  rlimit mine{};
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &mine) == 0);
  if (mine.rlim_max < 512) TROUPE_SKIP("the hard limit on open files here is below 512");   // RLIM_INFINITY is the largest value
  const std::string want = std::to_string(std::min<rlim_t>(mine.rlim_max, 65536));
  struct Restore {   // the daemons start from a low soft limit, inherited from this process (to the end)
    rlimit was;
    ~Restore() { ::setrlimit(RLIMIT_NOFILE, &was); }
  } restore{mine};
  rlimit low = mine;
  low.rlim_cur = 256;
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &low) == 0);
  itest::Cluster cluster;
  cluster.add_node("CPU=1");
  const auto pids = cluster.daemon_pids();
  REQUIRE(pids.size() == 2);   // the head's process (with its node) and the node's
  for (pid_t pid : pids) {
    std::string limits, soft, hard;
    REQUIRE(troupe::read_proc_file("/proc/" + std::to_string(pid) + "/limits", limits) == 0);
    if (const auto at = limits.find("Max open files"); at != std::string::npos) {
      std::istringstream in(limits.substr(at + std::string("Max open files").size()));
      in >> soft >> hard;
    }
    INFO("pid " << pid << ": soft " << soft << ", hard " << hard);
    CHECK(soft == want);
  }
}

TEST_CASE("random bytes and truncated messages to the head's port neither crash it nor change it") {
  itest::Cluster cluster;
  auto before = cluster.status();
  auto colon = cluster.address().rfind(':');
  int port = std::stoi(cluster.address().substr(colon + 1));
  std::mt19937 rng(7);
  const std::vector<std::string> shapes = {
      "", "GET", "POST /api/v1/nodes HTTP/1.1\r\nContent-Length: 100\r\n\r\n{\"addr",
      "POST /api/v1/actors HTTP/1.1\r\nAuthorization: Bearer x\r\nContent-Length: 5\r\n\r\n{{{{{",
      "GET /api/v1/status HTTP/1.1\r\nContent-Length: 99999999999999\r\n\r\n", "\x16\x03\x01\x02\x00"};
  for (int i = 0; i < 60; ++i) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(std::uint16_t(port));
    ::inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
    REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    std::string msg = i < int(shapes.size()) ? shapes[i] : std::string();
    if (msg.empty()) { msg.resize(rng() % 2048); for (auto& c : msg) c = char(rng()); }
    (void)!::send(fd, msg.data(), msg.size(), MSG_NOSIGNAL);
    ::close(fd);
  }
  auto after = cluster.status();
  REQUIRE(after.is_object());
  CHECK(after["nodes"].size() == before["nodes"].size());
  CHECK(after["actors"].size() == before["actors"].size());
  CHECK(after["nodes"][0]["state"] == "alive");
}

TEST_CASE("colocated actors share one worker process") {
  itest::Cluster cluster;
  auto rt = connect(cluster);
  auto first = rt.spawn<Store>(troupe::Options{}.process(true), 1);
  auto second = rt.spawn<Store>(troupe::Options{}.colocate_with(first), 2);
  auto third = rt.spawn<Store>(troupe::Options{}.process(true), 3);
  CHECK(first.call(&Store::pid).get() == second.call(&Store::pid).get());
  CHECK(first.call(&Store::pid).get() != third.call(&Store::pid).get());
  CHECK(second.call(&Store::add_via, first, 10).get() == 11);   // a local call inside the worker

  // Into a running worker an actor starts in about a millisecond, and the head's push that it runs
  // may reach this driver before the spawn's own reply does: each of them still becomes ready.
  std::vector<troupe::ActorRef<Store>> more;
  for (int i = 0; i < 30; ++i) more.push_back(rt.spawn<Store>(troupe::Options{}.colocate_with(first), i));
  for (int i = 0; i < 30; ++i) {
    CAPTURE(i);
    REQUIRE(more[std::size_t(i)].ready().wait_for(20s));
    CHECK(more[std::size_t(i)].call(&Store::get).get() == i);
  }
}

TEST_CASE("actors of a worker that share their threads run each other's calls, in order, and may wait on each other") {
  itest::Cluster cluster;
  auto rt = connect(cluster);
  auto a = rt.spawn<Store>(troupe::Options{}.name("a").process(true), 0);
  auto b = rt.spawn<Store>(troupe::Options{}.name("b").colocate_with(a), 0);
  auto c = rt.spawn<Store>(troupe::Options{}.name("c").colocate_with(a), 0);   // same process, not in the group
  // Before: each actor's calls run on its own thread.
  std::set<int> before_a, before_b;
  for (int i = 0; i < 20; ++i) {
    before_a.insert(a.call(&Store::tid).get());
    before_b.insert(b.call(&Store::tid).get());
  }
  CHECK(before_a.size() == 1);
  CHECK(before_b.size() == 1);
  CHECK(*before_a.begin() != *before_b.begin());
  troupe::share_thread(a, b);
  // Calls one at a time, alternating: the thread that answered one looks for the next and runs it
  // when it is the other actor's. Each actor's own calls stay in order (each add sees the last).
  std::set<int> on_a, on_b, on_c;
  for (int i = 1; i <= 200; ++i) {
    CAPTURE(i);
    REQUIRE(a.call(&Store::add, 1).get() == i);
    REQUIRE(b.call(&Store::add, 2).get() == 2 * i);
    on_a.insert(a.call(&Store::tid).get());
    on_b.insert(b.call(&Store::tid).get());
    if (i % 10 == 0) on_c.insert(c.call(&Store::tid).get());
  }
  std::set<int> both;
  std::set_intersection(on_a.begin(), on_a.end(), on_b.begin(), on_b.end(), std::inserter(both, both.end()));
  CHECK(!both.empty());   // some call of one ran on the thread that ran a call of the other
  for (int t : on_a) CHECK((t == *before_a.begin() || t == *before_b.begin()));   // the group's own threads only
  for (int t : on_b) CHECK((t == *before_a.begin() || t == *before_b.begin()));
  REQUIRE(on_c.size() == 1);   // c is not in the group: its calls stay on its thread, which runs no one else's
  CHECK(on_a.count(*on_c.begin()) == 0);
  CHECK(on_b.count(*on_c.begin()) == 0);
  // Bursts of calls sent without waiting, alternating: each actor's still run in the order sent.
  std::vector<troupe::Future<int>> burst_a, burst_b;
  for (int i = 1; i <= 100; ++i) {
    burst_a.push_back(a.call(&Store::add, 1));
    burst_b.push_back(b.call(&Store::add, 2));
  }
  for (int i = 1; i <= 100; ++i) {
    CAPTURE(i);
    CHECK(burst_a[std::size_t(i - 1)].get() == 200 + i);
    CHECK(burst_b[std::size_t(i - 1)].get() == 400 + 2 * i);
  }
  // A method that waits for an asynchronous call to the other member (call().get()), whichever
  // thread runs it: that call runs, and nothing waits for itself. Each follows a call of a's, whose
  // thread then looks for the next and so may run b's method, where a's own add is the call a's
  // thread would otherwise wait for (ActorCell::submit runs it there).
  // Which thread takes b's call first is a race (a's, still looking, or b's, asleep for it on the
  // lane), which a busy machine loses for a's: then a call of b's follows a pause longer than a
  // host's sleep on the lanes (kSleepLinger, 1 s), after which b's thread has parked on its
  // mailbox and a's, looking again after its own call, is the one the lane wakes.
  int ran_on_a = 0, n = 0;
  for (int i = 1; i <= 56; ++i) {
    CAPTURE(i);
    if (i > 50) {
      if (ran_on_a > 0) break;
      std::this_thread::sleep_for(1500ms);
    }
    REQUIRE(a.call(&Store::get).get() == 300 + 10 * n);
    auto via = b.call(&Store::add_via_tid, a, 10);
    REQUIRE(via.wait_for(20s));
    const auto got = via.get();
    REQUIRE(got.size() == 2);
    REQUIRE(got[1] == 300 + 10 * ++n);
    ran_on_a += got[0] == *before_a.begin();
  }
  CHECK(ran_on_a > 0);   // the case above did happen
  CHECK(a.call(&Store::get).get() == 300 + 10 * n);
  CHECK(b.call(&Store::get).get() == 600);
  CHECK(c.call(&Store::get).get() == 0);
}

namespace {

// A program run with no address, as a user runs one: its stdout is its own.
// With "wait" it then runs on until killed.
int embedded_program(const std::string& arg) {
  auto rt = troupe::Runtime::create(troupe::RuntimeConfig::from_env()).value();
  auto s = rt.spawn<Store>(troupe::Options{}.process(true), 10);
  const int sum = s.call(&Store::add, 1).get();
  std::cout << "result " << sum << std::endl;
  while (arg == "wait") ::pause();
  rt.shutdown();
  return 0;
}
TROUPE_TEST_HELPER("embedded-program", embedded_program);

}  // namespace

// troupe::init as a program's main calls it, with "--address ADDRESS" and a wrong token.
int init_program(const std::string& address) {
  std::string prog = "prog", flag = "--address", a = address, tflag = "--troupe-token", token = "not-the-token";
  char* argv[] = {prog.data(), flag.data(), a.data(), tflag.data(), token.data(), nullptr};
  auto rt = troupe::init(5, argv);   // exits with status 2 on the refusal
  std::cout << "connected" << std::endl;
  return 0;
}
TROUPE_TEST_HELPER("init-program", init_program);

TEST_CASE("a wrong token is an error value at create, and troupe::init exits with status 2 naming it") {
  itest::Cluster cluster;
  troupe::RuntimeConfig cfg;
  cfg.address = cluster.address();
  cfg.token = "not-the-token";
  auto refused = troupe::Runtime::create(cfg);   // the head checks the token at create
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.error().code == troupe::ErrorCode::Unavailable);
  CHECK(refused.error().message.find("token") != std::string::npos);
  // Later refusals are values too: the handles' futures fail with the refusal, nothing throws.
  cfg.token = cluster.token();
  {
    auto rt = troupe::Runtime::create(cfg).value();
    auto actor = rt.spawn<Store>(troupe::Options{}.resources("CPU=lots"), 1);
    CHECK(actor.id() == 0);
    REQUIRE(actor.ready().wait_for(10s));
    CHECK(actor.ready().result().error().code == troupe::ErrorCode::BadArguments);
    CHECK(actor.call(&Store::get).result().error().message.find("lots") != std::string::npos);
    auto group = rt.placement_group({"CPU=1"}, "SIDEWAYS");
    CHECK(group.id() == 0);
    CHECK(group.ready_future().result().error().code == troupe::ErrorCode::BadArguments);
  }   // one runtime per process: this one ends here

  int out = -1;
  const pid_t pid = itest::start_helper("init-program", cluster.address(), &out);
  const std::string printed = itest::read_all(out, 60s);
  ::close(out);
  int status = -1;
  ::waitpid(pid, &status, 0);
  REQUIRE(WIFEXITED(status));   // not killed by SIGABRT
  CHECK(WEXITSTATUS(status) == 2);
  CHECK(printed.empty());

  cluster.cli({"stop"});   // no head at the address: create says so
  auto lost = troupe::Runtime::create(cfg);
  REQUIRE_FALSE(lost.ok());
  CHECK(lost.error().code == troupe::ErrorCode::Unavailable);
}

TEST_CASE("an embedded run's stdout holds the program's output only: troupe logs to stderr") {
  test_support::TempDir sessions("troupe-embedded-out");   // its session, removed after (not /tmp/troupe)
  int out = -1;
  setenv("TROUPE_LOG_LEVEL", "info", 1);   // so that the runtime has lines to log
  setenv("TROUPE_TMPDIR", sessions.path.c_str(), 1);
  const pid_t pid = itest::start_helper("embedded-program", "", &out);
  unsetenv("TROUPE_LOG_LEVEL");
  unsetenv("TROUPE_TMPDIR");
  const std::string printed = itest::read_all(out, 60s);
  ::close(out);
  int status = -1;
  ::waitpid(pid, &status, 0);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(printed == "result 11\n");
}

TEST_CASE("an embedded run keeps a session of its own: troupe status still finds the started cluster, --all lists both") {
  itest::Cluster cluster;
  setenv("TROUPE_TMPDIR", cluster.temp_dir().c_str(), 1);   // the program's sessions go where the cluster's are
  int out = -1;
  const pid_t program = itest::start_helper("embedded-program", "wait", &out);
  unsetenv("TROUPE_TMPDIR");
  CHECK(itest::read_line(out, 60s) == "result 11");
  int rc = -1;
  const auto latest = json::parse(cluster.cli({"status", "--json"}, &rc), nullptr, false);   // this machine's default
  CHECK(rc == 0);
  REQUIRE(latest.is_object());
  CHECK(latest.value("head", "") == cluster.address());
  const auto all = json::parse(cluster.cli({"status", "--all", "--json"}, &rc), nullptr, false);
  CHECK(rc == 0);
  REQUIRE(all.is_array());
  REQUIRE(all.size() == 2);
  int embedded = 0;
  for (const auto& s : all) embedded += s.value("embedded", false) ? 1 : 0;
  CHECK(embedded == 1);
  ::kill(program, SIGKILL);
  ::waitpid(program, nullptr, 0);
  ::close(out);
  const auto after = json::parse(cluster.cli({"status", "--all", "--json"}, &rc), nullptr, false);
  CHECK(after.size() == 1);   // a session whose head is gone is not listed
}

TEST_CASE("without an address, a process actor runs on an embedded head and node") {
  test_support::TempDir dir("troupe-embedded");
  int worker_pid = 0;
  {
    troupe::RuntimeConfig cfg;
    cfg.session_root = dir.path;
    auto rt = troupe::Runtime::create(cfg).value();
    auto local = rt.spawn<Store>(troupe::Options{}, 1);
    auto remote = rt.spawn<Store>(troupe::Options{}.process(true), 2);
    CHECK(local.call(&Store::pid).get() == int(::getpid()));
    worker_pid = remote.call(&Store::pid).get();
    CHECK(worker_pid != int(::getpid()));
    auto other = rt.spawn<Store>(troupe::Options{}.process(true), 10);
    CHECK(remote.call(&Store::add_via, other, 5).get() == 15);   // worker to worker
    // An in-process actor passed to a worker is called there (defect 6): the head numbers it
    // and the worker links to this process.
    CHECK(remote.call(&Store::add_via, local, 5).get() == 6);
    CHECK(local.call(&Store::get).get() == 6);
  }
  // The runtime's shutdown stopped the embedded node and its worker.
  CHECK(::kill(worker_pid, 0) != 0);
}

// troupe::init's malloc settings (runtime/src/process_memory.hpp), as a worker process has them:
// an actor that frees 80 MiB and allocates it again gets the same pages back. With glibc's defaults
// each round faults its 20,480 pages in again (20,450 measured: blocks over the mmap threshold, a
// mapping of their own each time, or a trimmed heap); with the thresholds but not the top pad,
// the 16 MiB past its arena's first heap (4,353: the second heap unmapped once empty). And the
// worker allocates from one arena: what one actor's thread freed, a colocated actor's thread gets
// back. With an arena per thread (glibc's default, MALLOC_ARENA_MAX=8 here), that actor's first
// round faults in all its pages (20,482 measured).
TEST_CASE("actors in a worker process reuse the memory freed there: allocating it again faults in under a tenth of its pages") {
  test_support::TempDir dir("troupe-malloc");
  troupe::RuntimeConfig cfg;
  cfg.session_root = dir.path;
  auto rt = troupe::Runtime::create(cfg).value();
  auto remote = rt.spawn<Store>(troupe::Options{}.process(true), 0);
  const long faults = remote.call(&Store::refault, 80, 3).get();
  INFO("page faults in the third round of 80 MiB: " << faults);
  CHECK(faults < 2048);
  auto other = rt.spawn<Store>(troupe::Options{}.colocate_with(remote), 0);   // another thread of the same process
  REQUIRE(other.call(&Store::pid).get() == remote.call(&Store::pid).get());
  REQUIRE(other.call(&Store::tid).get() != remote.call(&Store::tid).get());
  const long other_faults = other.call(&Store::refault, 80, 1).get();   // its first round: the pages freed, or fresh ones
  INFO("page faults of the colocated actor's first round of 80 MiB: " << other_faults);
  CHECK(other_faults < 2048);
}

TEST_CASE("placement groups reserve bundles across nodes, and colocated actors share a bundle's process") {
  itest::Cluster cluster("CPU=2");
  cluster.add_node("CPU=2");
  auto rt = connect(cluster);
  auto pg = rt.placement_group({"CPU=1", "CPU=1"}, "STRICT_SPREAD", "pair");
  REQUIRE(pg.ready(10s));
  auto trainer = rt.spawn<Store>(troupe::Options{}.bundle(pg, 0, true).cpus(0.5), 1);
  auto rollout = rt.spawn<Store>(troupe::Options{}.bundle(pg, 0, true).cpus(0.5), 2);
  auto other = rt.spawn<Store>(troupe::Options{}.bundle(pg, 1).cpus(1), 3);
  CHECK(trainer.call(&Store::pid).get() == rollout.call(&Store::pid).get());
  CHECK(cluster.actor(trainer.id()).value("node", std::uint64_t{0}) != cluster.actor(other.id()).value("node", std::uint64_t{0}));
  auto groups = cluster.status().value("placement_groups", nlohmann::json::array());
  REQUIRE(groups.size() == 1);
  CHECK(groups[0]["state"] == "CREATED");
  CHECK(groups[0]["bundles"][0]["node"] != groups[0]["bundles"][1]["node"]);

  // More bundles than nodes under STRICT_SPREAD: never partly placed, it waits as pending.
  auto wide = rt.placement_group({"CPU=0.1", "CPU=0.1", "CPU=0.1"}, "STRICT_SPREAD");
  CHECK_FALSE(wide.ready(300ms));
  CHECK(wide.state() == "PENDING");
  // A malformed bundle is refused as a value: the group's future fails with the refusal.
  auto bad = rt.placement_group({"CPU=lots"});
  CHECK(bad.id() == 0);
  CHECK(bad.state() == "REFUSED");
  REQUIRE(bad.ready_future().wait_for(1s));
  CHECK(bad.ready_future().result().error().code == ErrorCode::BadArguments);
  CHECK_FALSE(bad.ready(10ms));
  // A group's readiness is pushed: one that waits for room (1 CPU is free on each node) is
  // ready once the pair's bundles are released.
  auto later = rt.placement_group({"CPU=1.5"});
  auto later_ready = later.ready_future();
  CHECK_FALSE(later_ready.wait_for(300ms));

  pg.remove();   // releases the bundles and kills the actors in them
  auto f = trainer.call(&Store::get);
  REQUIRE(f.wait_for(10s));
  CHECK(f.result().error().code == ErrorCode::ActorDied);
  CHECK(pg.state() == "REMOVED");
  REQUIRE(later_ready.wait_for(10s));
  CHECK(later_ready.result().ok());
  CHECK(later.state() == "CREATED");
  later.remove();   // a removed group's future fails
  REQUIRE(later.ready_future().wait_for(10s));
  CHECK(later.ready_future().result().error().code == troupe::PlacementCode::NotFound);
}
