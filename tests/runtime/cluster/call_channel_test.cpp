// The call channel in-process: frames round-trip, bad bytes are refused without harm, the token
// is checked once per connection, calls reach their host and replies come back in order.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <caf/all.hpp>

#include <chrono>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <random>
#include <vector>

#include "actor_cell.hpp"
#include "cluster/call_channel.hpp"
#include "cluster/remote_route.hpp"
#include "deadline_timer.hpp"
#include "troupe/future.hpp"
#include "troupe/net/address.hpp"
#include "troupe/net/frames.hpp"

namespace cl = troupe::cluster;
using troupe::detail::ChannelCall;
using troupe::detail::WireCall;
using troupe::detail::WireReply;

namespace {

// Collects the replies a channel's reader thread delivers.
struct Replies {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<WireReply> got;

  cl::CallChannel::ReplyHandler handler() {
    return [this](WireReply& r) {
      std::lock_guard lk(mu);
      got.push_back(r);
      cv.notify_all();
    };
  }
  bool wait_for(std::size_t n) {
    std::unique_lock lk(mu);
    return cv.wait_for(lk, std::chrono::seconds(10), [&] { return got.size() >= n; });
  }
};

// A host that echoes the arguments and reports the token the server filled in. (The unused int:
// CAF 0.17 spawns an argument-less function actor through a null tuple pointer, which UBSan flags.)
caf::behavior echo_host(caf::event_based_actor*, int) {
  return {[](ChannelCall& cc) {
    WireReply r;
    r.actor_id = cc.call.actor_id;
    r.incarnation = cc.call.incarnation;
    r.seq = cc.call.seq;
    r.result = cc.call.args;
    r.error = cc.call.token;   // an ok reply's message field, used here to report the token
    r.tensors = cc.call.tensors;
    cc.sink->reply(r);
  }};
}

WireCall make_call(std::uint64_t actor, std::uint64_t incarnation, std::uint64_t seq) {
  WireCall c;
  c.actor_id = actor;
  c.incarnation = incarnation;
  c.seq = seq;
  c.method = "echo";
  c.args = {char(seq & 0x7F), 'x', 'y'};
  c.tensors = {{'t', char(seq & 0x7F)}, {}};
  return c;
}

// A raw TCP connection to the server, for sending bytes no channel would.
int raw_connect(const std::string& address) {
  auto [host, port] = troupe::net::split_address(address);
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  ::inet_pton(AF_INET, host.c_str(), &a.sin_addr);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  return fd;
}

// True when the server closes `fd` (reads EOF) within a few seconds.
bool closed_by_peer(int fd) {
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  char buf[256];
  for (;;) {
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n == 0) return true;
    if (n < 0) return errno == ECONNRESET;
  }
}

}  // namespace

TEST_CASE("the token a middleman call carries never travels in a call channel's frame") {
  WireCall c = make_call(7, 3, 99);
  c.token = "tok-never-on-the-wire";
  auto frame = troupe::net::encode_call(c);   // what CallChannel::send writes
  std::string bytes(frame.begin(), frame.end());
  CHECK(bytes.find("tok-never-on-the-wire") == std::string::npos);
  CHECK(bytes.find("echo") != std::string::npos);   // (the frame does hold the call)
}

TEST_CASE("a call server checks the token, routes calls to hosts in order and survives bad peers") {
  caf::actor_system_config cfg;
  cfg.set("scheduler.max-threads", 2);
  caf::actor_system sys{cfg};
  cl::CallServer server("secret", "127.0.0.1");
  auto host = sys.spawn(echo_host, 0);
  server.add(7, 3, host);

  Replies refused;
  CHECK(cl::CallChannel::open(server.address(), "wrong", refused.handler(), nullptr, std::chrono::seconds(5)) == nullptr);
  CHECK(cl::CallChannel::open(server.address(), "", refused.handler(), nullptr, std::chrono::seconds(5)) == nullptr);
  CHECK(cl::CallChannel::open("127.0.0.1:1", "secret", refused.handler(), nullptr, std::chrono::seconds(2)) == nullptr);

  Replies replies;
  std::atomic<int> broken_calls{0};
  std::atomic<bool> closed_here{false};
  auto ch = cl::CallChannel::open(server.address(), "secret", replies.handler(),
                                  [&](const cl::CallChannel*, bool here) { closed_here = here; ++broken_calls; }, std::chrono::seconds(5));
  REQUIRE(ch != nullptr);
  constexpr int kCalls = 200;
  for (int i = 1; i <= kCalls; ++i) REQUIRE(ch->send(make_call(7, 3, std::uint64_t(i))));
  REQUIRE(replies.wait_for(kCalls));
  for (int i = 0; i < kCalls; ++i) {   // one caller, one host: submission order
    CHECK(replies.got[i].seq == std::uint64_t(i + 1));
    CHECK(replies.got[i].ok());
    CHECK(replies.got[i].error == "secret");   // the host sees the connection's checked token
    CHECK(replies.got[i].result == make_call(7, 3, std::uint64_t(i + 1)).args);
    CHECK(replies.got[i].tensors == make_call(7, 3, std::uint64_t(i + 1)).tensors);
  }

  SUBCASE("a call for another incarnation or an unknown actor fails with ActorDied (FT-2)") {
    replies.got.clear();
    REQUIRE(ch->send(make_call(7, 2, 1000)));
    REQUIRE(ch->send(make_call(8, 1, 1001)));
    server.remove(7);
    REQUIRE(ch->send(make_call(7, 3, 1002)));
    REQUIRE(replies.wait_for(3));
    for (const auto& r : replies.got) {
      CHECK(r.error_value().code == troupe::ErrorCode::ActorDied);
      CHECK(r.error.find("not hosted here") != std::string::npos);
    }
  }

  SUBCASE("random bytes, a bad handshake and a bad frame close only their own connection") {
    int junk = raw_connect(server.address());
    std::vector<char> noise(4096);
    std::mt19937 rng(7);
    for (auto& b : noise) b = char(rng());
    ::send(junk, noise.data(), noise.size(), MSG_NOSIGNAL);
    CHECK(closed_by_peer(junk));
    ::close(junk);

    int huge = raw_connect(server.address());   // a length far beyond the handshake's limit
    const unsigned char len[5] = {0xFF, 0xFF, 0xFF, 0x7F, 'H'};
    ::send(huge, len, sizeof len, MSG_NOSIGNAL);
    CHECK(closed_by_peer(huge));
    ::close(huge);

    int truncated = raw_connect(server.address());   // a handshake cut short, then silence
    const unsigned char part[3] = {10, 0, 0};
    ::send(truncated, part, sizeof part, MSG_NOSIGNAL);
    ::shutdown(truncated, SHUT_WR);
    CHECK(closed_by_peer(truncated));
    ::close(truncated);

    int bad_frame = raw_connect(server.address());   // authenticated, then a frame of garbage
    std::string hello = std::string("\x07\x00\x00\x00H", 5) + "secret";
    ::send(bad_frame, hello.data(), hello.size(), MSG_NOSIGNAL);
    char ok[5];
    REQUIRE(::recv(bad_frame, ok, 5, MSG_WAITALL) == 5);
    CHECK(ok[4] == 'O');
    const unsigned char garbage[9] = {5, 0, 0, 0, 'C', 0xC1, 0xC1, 0xC1, 0xC1};
    ::send(bad_frame, garbage, sizeof garbage, MSG_NOSIGNAL);
    CHECK(closed_by_peer(bad_frame));
    ::close(bad_frame);

    // The good channel was never disturbed.
    replies.got.clear();
    REQUIRE(ch->send(make_call(7, 3, 5000)));
    REQUIRE(replies.wait_for(1));
    CHECK(replies.got[0].seq == 5000);
    CHECK(replies.got[0].ok());
  }

  SUBCASE("a stopped server breaks the channel; sends then report failure") {
    server.stop();
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (!ch->broken() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    CHECK(ch->broken());
    CHECK_FALSE(ch->send(make_call(7, 3, 1)));
    for (int i = 0; i < 500 && broken_calls == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    CHECK(broken_calls == 1);        // the owner hears of it once, on the reader thread
    CHECK_FALSE(closed_here.load()); // the other side ended it
  }

  ch->close();
  CHECK(broken_calls == 1);
  server.stop();
  caf::anon_send_exit(host, caf::exit_reason::user_shutdown);
}

TEST_CASE("calls on a channel that breaks under a live worker are resent or fail with Unavailable, not at their deadline") {
  caf::actor_system_config cfg;
  cfg.set("scheduler.max-threads", 2);
  caf::actor_system sys{cfg};
  cl::CallServer server("secret", "127.0.0.1");
  auto silent = sys.spawn([](caf::event_based_actor*, int) -> caf::behavior {   // takes calls, never answers
    return {[](ChannelCall&) {}, [](WireCall&) {}};
  }, 0);
  server.add(7, 3, silent);
  troupe::detail::DeadlineTimer timer;
  auto make_cell = [&](int retries) {
    return std::make_shared<troupe::detail::ActorCell>(
        troupe::detail::CellSpec{7, "T", "T#7", std::chrono::seconds(60), retries, /*remote=*/true},
        troupe::detail::CallTableEnv{&timer, nullptr});
  };
  auto once = make_cell(0), retried = make_cell(1);
  auto drop = [](const std::shared_ptr<troupe::detail::ActorCell>& cell, const cl::CallChannel* broken) {
    auto route = cell->route();   // as ClusterClient does, without its grace
    const auto* on = dynamic_cast<const cl::ChannelRoute*>(route.get());
    if (on != nullptr && on->channel() == broken) cell->route_broken(on, "lost its call channel");
  };
  auto ch = cl::CallChannel::open(
      server.address(), "secret", [](WireReply&) {},
      [&](const cl::CallChannel* broken, bool closed_here) {
        if (closed_here) return;
        drop(once, broken);
        drop(retried, broken);
      },
      std::chrono::seconds(5));
  REQUIRE(ch != nullptr);
  for (auto& cell : {once, retried}) {
    auto middleman = std::make_shared<cl::MiddlemanRoute>(7, 3, caf::actor{}, silent, "secret", caf::actor{});
    cell->bind(std::make_shared<cl::ChannelRoute>(7, 3, ch, middleman));
  }
  troupe::Promise<int> p1, p2;
  once->submit("m", troupe::Payload{}, p1.state(), std::chrono::seconds(60));
  retried->submit("m", troupe::Payload{}, p2.state(), std::chrono::seconds(60));
  troupe::Future<int> f1(p1.state()), f2(p2.state());
  CHECK_FALSE(f1.wait_for(std::chrono::milliseconds(100)));   // the worker holds them

  server.stop();   // the connection ends; the worker's host is still alive
  REQUIRE(f1.wait_for(std::chrono::seconds(5)));
  CHECK(f1.result().error().code == troupe::ErrorCode::Unavailable);
  CHECK(f1.result().error().message.find("may have run") != std::string::npos);
  // With a retry left, the call was sent again through the middleman (to the silent host): pending.
  CHECK_FALSE(f2.wait_for(std::chrono::milliseconds(200)));
  auto b = retried->route();   // now the middleman route: no channel
  REQUIRE(b != nullptr);
  CHECK(dynamic_cast<const cl::ChannelRoute*>(b.get()) == nullptr);
  CHECK(dynamic_cast<const cl::MiddlemanRoute*>(b.get()) != nullptr);
  ch->close();
  once->mark_dead("test over");
  retried->mark_dead("test over");
  caf::anon_send_exit(silent, caf::exit_reason::user_shutdown);
}
