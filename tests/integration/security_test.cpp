// SEC-1 at every door: well-formed messages of each protocol (link calls, the head's control
// messages: a node's or a worker's hello and events; spawn and kill over HTTP) sent without the cluster token, or with a wrong one, to every TCP port the cluster's
// processes listen on (read from /proc) change no state and kill nothing.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "cluster_harness.hpp"
#include "test_actors.hpp"
#include "troupe/net/frames.hpp"
#include "troupe/net/http.hpp"
#include "troupe/net/link.hpp"
#include "cluster/peers.hpp"
#include "runtime_impl.hpp"

using namespace std::chrono_literals;
namespace net = troupe::net;

namespace {

// The TCP ports process `pid` listens on (its socket inodes matched against /proc/net/tcp{,6}).
std::set<std::uint16_t> listening_ports(pid_t pid) {
  std::set<std::string> inodes;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec)) {
    auto target = std::filesystem::read_symlink(e.path(), ec);
    std::string t = target.string();
    if (!ec && t.rfind("socket:[", 0) == 0) inodes.insert(t.substr(8, t.size() - 9));
  }
  std::set<std::uint16_t> ports;
  for (const char* table : {"/net/tcp", "/net/tcp6"}) {
    std::ifstream in("/proc/" + std::to_string(pid) + table);
    std::string line;
    std::getline(in, line);   // the header
    while (std::getline(in, line)) {
      std::istringstream row(line);
      std::string slot, local, remote, state, queues, timer, retr, uid, timeout, inode;
      row >> slot >> local >> remote >> state >> queues >> timer >> retr >> uid >> timeout >> inode;
      if (state == "0A" && inodes.count(inode)) ports.insert(std::uint16_t(std::stoul(local.substr(local.find(':') + 1), nullptr, 16)));
    }
  }
  return ports;
}

// Sends `bytes` to 127.0.0.1:port, reads what comes back for a moment, closes. Never throws.
void poke(std::uint16_t port, const std::string& bytes) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  ::inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
    ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    timeval tv{0, 300000};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char buf[4096];
    while (::recv(fd, buf, sizeof buf, 0) > 0) {
    }
  }
  ::close(fd);
}

// A link message as a peer that skipped the handshake would send it: [u32 len][kind][flags][body].
std::string link_message(char kind, const std::vector<char>& body) {
  std::string f(6, '\0');
  std::uint32_t n = std::uint32_t(body.size() + 2);
  for (int i = 0; i < 4; ++i) f[std::size_t(i)] = char((n >> (8 * i)) & 0xFF);
  f[4] = kind;
  return f + std::string(body.begin(), body.end());
}

std::vector<char> as_bytes(const std::string& s) { return std::vector<char>(s.begin(), s.end()); }

std::string http(const std::string& method, const std::string& target, const std::string& body,
                 const std::string& token) {
  std::string r = method + " " + target + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n";
  if (!token.empty()) r += "Authorization: Bearer " + token + "\r\n";
  return r + "Content-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
}

}  // namespace

TEST_CASE("SEC-1: messages without the token or with a wrong one, to every port of the cluster, change nothing") {
  itest::Cluster cluster;
  cluster.add_node("CPU=2");
  auto rt = itest::connect(cluster, 60s);
  auto victim = rt.spawn<Store>(troupe::Options{}.name("victim").process(true), 5);
  REQUIRE(victim.ready().wait_for(30s));
  const int worker = victim.call(&Store::pid).get();
  (void)victim.call(&Store::make, std::int64_t(1 << 20), 1).get();   // the data plane is up too
  const auto before = cluster.status();

  std::vector<pid_t> pids = cluster.daemon_pids();
  pids.push_back(worker);
  std::set<std::uint16_t> ports;
  std::ostringstream seen;
  for (pid_t p : pids) {
    auto found = listening_ports(p);
    ports.insert(found.begin(), found.end());
    seen << (p == worker ? " worker" : " daemon") << " " << p << ":";
    for (auto port : found) seen << ' ' << port;
  }
  REQUIRE(ports.size() >= 4);   // the head's HTTP and link ports, the worker's link port, UCX's listener, ...
  const std::string head_link = before.value("link", "");
  REQUIRE_FALSE(head_link.empty());
  CHECK(ports.count(std::uint16_t(std::stoul(head_link.substr(head_link.rfind(':') + 1)))) == 1);
  MESSAGE("listening ports:" << seen.str());

  // A call that would add 1000 to the victim, as a link message; spawn and kill over HTTP.
  net::CallFrame call;
  call.actor_id = victim.id();
  call.incarnation = 1;
  call.seq = 1;
  call.method = "add";
  call.args = troupe::encode_args(1000).bytes;
  const auto call_body = net::encode_call(call);
  const std::string kill_path = "/api/v1/actors/" + std::to_string(victim.id()) + "/kill";
  const std::string spawn_body = R"({"type":"Store","ctor_signature":"x","ctor_args":"9105","binary":"/bin/true"})";
  for (auto port : ports) {
    for (const std::string& token : {std::string(), std::string("wrong-token")}) {
      poke(port, link_message('C', call_body));
      poke(port, link_message('B', std::vector<char>(200, 'x')) + link_message('C', call_body));
      poke(port, http("POST", kill_path, "{}", token));
      poke(port, http("POST", "/api/v1/actors", spawn_body, token));
      poke(port, http("POST", "/api/v1/nodes/1/events", R"({"events":[{"kind":"worker_exited"}]})", token));
      // The head's control messages, unauthenticated: a node's hello, then the exit of every worker.
      poke(port, link_message('H', as_bytes(R"({"role":"node","resources":"CPU=64"})")) +
                     link_message('E', as_bytes(R"({"events":[{"kind":"worker_exited","worker_id":1},{"kind":"worker_exited","worker_id":2}]})")));
      poke(port, link_message('H', as_bytes(R"({"role":"worker","worker_id":1,"gateway":"127.0.0.1:1"})")) +
                     link_message('E', as_bytes(R"({"events":[{"kind":"actor_failed","actor_id":)" + std::to_string(victim.id()) +
                                                R"(,"incarnation":1}]})")));
      net::LinkHub impostor(token.empty() ? "x" : token, net::self_identity("impostor"));
      try {   // a troupe process that holds another token: refused at the handshake
        auto link = impostor.connect("127.0.0.1:" + std::to_string(port), nullptr, nullptr, 2s);
        link->send('C', call_body);
        FAIL("port " << port << " accepted a link without the cluster token");
      } catch (const troupe::ErrorException&) {
      }
    }
  }

  // Nothing changed: the victim runs on, in the same process, with the value it had.
  CHECK(victim.call(&Store::get).get() == 5);
  CHECK(victim.call(&Store::pid).get() == worker);
  const auto after = cluster.status();
  CHECK(after["actors"].size() == before["actors"].size());
  CHECK(after["nodes"].size() == before["nodes"].size());
  for (const auto& a : after["actors"]) CHECK(a.value("state", "") == "alive");
  for (const auto& n : after["nodes"]) CHECK(n.value("state", "") == "alive");
}

// A link to a live worker that ends for a fault (here the worker refuses a malformed call frame
// and closes it) is linked again: after the grace for the head's word (10 s), the actor's calls,
// those made meanwhile included, go out on a new link to the same process. Before, nothing linked
// it again, and every later call waited out its deadline.
TEST_CASE("after a link to a live worker ends for a fault, its actors are linked again and calls made meanwhile are answered") {
  itest::Cluster cluster;
  auto rt = itest::connect(cluster, 60s);
  auto a = rt.spawn<Store>(troupe::Options{}.process(true), 7);
  REQUIRE(a.ready().wait_for(30s));
  const int pid = a.call(&Store::pid).get();
  const auto gateway = cluster.actor(a.id()).value("gateway", std::string());
  REQUIRE_FALSE(gateway.empty());
  auto* peers = troupe::detail::RuntimeImpl::current()->peers_if_any();
  REQUIRE(peers != nullptr);
  auto link = peers->link_to(gateway);
  REQUIRE(link != nullptr);
  REQUIRE(link->send('C', std::vector<char>{'n', 'o', 't', ' ', 'a', ' ', 'c', 'a', 'l', 'l'}));
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (!link->closed() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(10ms);
  REQUIRE(link->closed());
  auto meanwhile = a.call(&Store::add, 1);
  REQUIRE(meanwhile.wait_for(40s));
  CHECK(meanwhile.result().value() == 8);
  CHECK(a.call(&Store::pid).get() == pid);   // the same process: not restarted, linked again
  CHECK(a.call(&Store::get).get() == 8);
}

TEST_CASE("a first call to a new actor in a running worker process costs one round trip after ready()") {
  itest::Cluster cluster;
  auto rt = itest::connect(cluster, 60s);
  auto first = rt.spawn<Store>(troupe::Options{}.process(true), 1);
  REQUIRE(first.ready().wait_for(30s));
  CHECK(first.call(&Store::get).get() == 1);   // the link to its worker process exists now
  auto fresh = rt.spawn<Store>(troupe::Options{}.colocate_with(first), 2);
  REQUIRE(fresh.ready().wait_for(30s));
  auto* peers = troupe::detail::RuntimeImpl::current()->peers_if_any();
  REQUIRE(peers != nullptr);
  const auto before = peers->counts();
  CHECK(fresh.call(&Store::get).get() == 2);
  const auto after = peers->counts();
  CHECK(after.sent - before.sent == 1);          // the call
  CHECK(after.received - before.received == 1);   // its reply
}
