// Links between two hubs in one process, on 127.0.0.1: both ends authenticate without sending the
// token, messages of any size arrive whole and in order, bad peers are refused without harm to
// other links, and a silent peer is closed as frozen while an idle one stays open.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "troupe/error.hpp"
#include "troupe/net/address.hpp"
#include "troupe/net/link.hpp"
#include "frame_header.hpp"   // white-box: a frame's header
#include "lane.hpp"   // white-box: a lane file's header

namespace net = troupe::net;
using namespace std::chrono_literals;

namespace {

// What one end received, and whether (and how) its link closed.
struct Inbox {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::pair<char, std::vector<char>>> got;
  bool closed = false;
  net::LinkEnd end = net::LinkEnd::Closed;
  std::string why;

  net::Link::MessageHandler on_message() {
    return [this](net::Link&, char kind, std::vector<char>& body) {
      std::lock_guard lk(mu);
      got.emplace_back(kind, std::move(body));
      cv.notify_all();
    };
  }
  net::Link::ClosedHandler on_closed() {
    return [this](net::Link&, net::LinkEnd how, const std::string& reason) {
      std::lock_guard lk(mu);
      closed = true;
      end = how;
      why = reason;
      cv.notify_all();
    };
  }
  bool wait_messages(std::size_t n, std::chrono::milliseconds t = 10s) {
    std::unique_lock lk(mu);
    return cv.wait_for(lk, t, [&] { return got.size() >= n; });
  }
  bool wait_closed(std::chrono::milliseconds t) {
    std::unique_lock lk(mu);
    return cv.wait_for(lk, t, [&] { return closed; });
  }
};

// A server hub whose accepted links land in `inbox`. While a test holds `gate`, the server's io
// thread stops in its next message's handler: it reads nothing more, as a frozen process would.
// The hub is declared after what its io thread uses, so that it stops before they go.
struct Server {
  std::mutex gate;
  Inbox inbox;
  std::vector<std::shared_ptr<net::Link>> links;
  std::mutex mu;
  net::LinkHub hub;
  std::string address;

  explicit Server(const std::string& token, net::LinkOptions opts = {}, net::PeerIdentity self = net::self_identity("server"))
      : hub(token, std::move(self), opts) {
    address = hub.listen("127.0.0.1", [this](const std::shared_ptr<net::Link>& l) {
      l->set_handlers([this, deliver = inbox.on_message()](net::Link& link, char kind, std::vector<char>& body) {
        std::lock_guard g(gate);
        deliver(link, kind, body);
      }, inbox.on_closed());
      std::lock_guard lk(mu);
      links.push_back(l);
    });
  }
};

// A client hub with one link to `server`, whose messages land in `inbox`.
struct Client {
  Inbox inbox;
  net::LinkHub hub;
  std::shared_ptr<net::Link> link;

  explicit Client(const Server& server, net::LinkOptions opts = {})
      : hub("secret", net::self_identity("client"), opts),
        link(hub.connect(server.address, inbox.on_message(), inbox.on_closed(), 5s)) {
    REQUIRE(link != nullptr);
  }
};

int raw_connect(const std::string& address) {
  auto [host, port] = net::split_address(address);
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  ::inet_pton(AF_INET, host.c_str(), &a.sin_addr);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  return fd;
}

// Connects `hub` to `address`, which must refuse it (`linked`: what it means if it does not):
// the refusal's words.
std::string refusal(net::LinkHub& hub, const std::string& address, const char* linked) {
  try {   // handlers that hold nothing: a link made by mistake outlives this call harmlessly
    (void)hub.connect(address, [](net::Link&, char, std::vector<char>&) {}, [](net::Link&, net::LinkEnd, const std::string&) {}, 5s);
  } catch (const troupe::ErrorException& e) {
    CHECK(e.code() == troupe::NetCode::Refused);
    return e.what();
  }
  FAIL(std::string(linked));
  return "";
}

// True when the server closes `fd` within `t`.
bool closed_by_peer(int fd, std::chrono::seconds t = 5s) {
  timeval tv{static_cast<time_t>(t.count()), 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  char buf[256];
  for (;;) {
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n == 0) return true;
    if (n < 0) return errno == ECONNRESET;
  }
}

// A heartbeat every `heartbeat`; a link that hears nothing for `silence` closes as frozen.
net::LinkOptions beating(std::chrono::milliseconds heartbeat, std::chrono::milliseconds silence) {
  net::LinkOptions o;
  o.heartbeat = heartbeat;
  o.silence_limit = silence;
  return o;
}

std::vector<char> pattern(std::size_t n, unsigned seed) {
  std::vector<char> v(n);
  std::mt19937 rng(seed);
  for (auto& c : v) c = char(rng());
  return v;
}

}  // namespace

TEST_CASE("links: both ends prove the token, and messages of any size arrive whole and in order") {
  Server server("secret");
  Inbox replies;
  net::LinkHub client("secret", net::self_identity("client"));
  auto link = client.connect(server.address, replies.on_message(), replies.on_closed(), 5s);
  REQUIRE(link != nullptr);
  CHECK(link->peer().role == "server");
  CHECK(link->peer().pid == std::uint32_t(::getpid()));
  CHECK_FALSE(net::peer_exited(link->peer()));   // this very process

  const auto big = pattern(3u << 20, 7);   // 12 chunks; small messages are sent on both sides of it
  for (int i = 0; i < 100; ++i) REQUIRE(link->send('m', std::vector<char>{char(i)}));
  REQUIRE(link->send('b', big));
  for (int i = 100; i < 200; ++i) REQUIRE(link->send('m', std::vector<char>{char(i)}));
  REQUIRE(link->send('e', std::vector<char>{}));   // empty bodies are messages too
  REQUIRE(server.inbox.wait_messages(202));
  {
    std::lock_guard lk(server.inbox.mu);
    const auto& got = server.inbox.got;
    for (int i = 0; i < 100; ++i) CHECK(got[i] == std::make_pair('m', std::vector<char>{char(i)}));
    CHECK(got[100].first == 'b');
    CHECK(got[100].second == big);
    for (int i = 100; i < 200; ++i) CHECK(got[i + 1] == std::make_pair('m', std::vector<char>{char(i)}));
    CHECK(got[201].first == 'e');
    CHECK(got[201].second.empty());
  }

  // And the other way, on the accepted link.
  std::shared_ptr<net::Link> accepted;
  {
    std::lock_guard slk(server.mu);
    REQUIRE(server.links.size() == 1);
    accepted = server.links[0];
  }
  CHECK(accepted->peer().role == "client");
  REQUIRE(accepted->send('r', std::vector<char>{'o', 'k'}));
  REQUIRE(replies.wait_messages(1));
  CHECK(replies.got[0].second == std::vector<char>{'o', 'k'});

  // The reader cuts frames from a 64 KiB buffer: bodies just under, at and over its size, and
  // over a chunk, back to back with one-byte ones, so that frames straddle every boundary.
  const std::vector<std::size_t> sizes{65530, 1, 65536, 1, 65537, 3, 70000, 1, 131075, 2, 300000, 5, 65535};
  std::vector<std::vector<char>> sent;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    sent.push_back(pattern(sizes[i], unsigned(100 + i)));
    REQUIRE(accepted->send('s', sent.back()));
  }
  REQUIRE(replies.wait_messages(1 + sizes.size()));
  {
    std::lock_guard lk(replies.mu);
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      CHECK(replies.got[1 + i].first == 's');
      CHECK(replies.got[1 + i].second == sent[i]);
    }
  }
  link->close();
  CHECK(server.inbox.wait_closed(5s));
  CHECK(server.inbox.end == net::LinkEnd::Lost);   // the peer closed it, and its process runs on
  CHECK(replies.wait_closed(5s));
  CHECK(replies.end == net::LinkEnd::Closed);
  CHECK_FALSE(link->send('m', std::vector<char>{1}));   // a closed link takes nothing
}

TEST_CASE("links: batched messages leave in order with the others, and none is left in an outbox") {
  // No heartbeats within the test: a message left in an outbox would stay there (a heartbeat
  // wakes the io thread, which would write it on its next look).
  const auto quiet = beating(60s, 120s);
  Server server("secret", quiet);
  Client client(server, quiet);
  auto& link = client.link;
  using net::Link;
  // Batched and immediate ones mixed, over the outbox's 64 KiB, and bodies over the batched size.
  std::vector<std::vector<char>> sent;
  for (int i = 0; i < 300; ++i) {
    sent.push_back(pattern(i % 50 == 7 ? 20000 : std::size_t(1 + i * 13 % 4096), unsigned(i)));
    REQUIRE(link->send('m', sent.back(), i % 10 == 9 ? Link::Send::Now : Link::Send::Batched));
  }
  REQUIRE(server.inbox.wait_messages(sent.size()));
  {
    std::lock_guard lk(server.inbox.mu);
    for (std::size_t i = 0; i < sent.size(); ++i) CHECK(server.inbox.got[i].second == sent[i]);
  }
  // With no flush and nothing else sent: after the io thread has parked, and right after it ran
  // (the message above), the message still leaves.
  for (auto pause : {50ms, 0ms, 1ms}) {
    std::this_thread::sleep_for(pause);
    const std::size_t before = sent.size();
    sent.push_back(pattern(100, unsigned(before)));
    REQUIRE(link->send('m', sent.back(), Link::Send::Batched));
    REQUIRE(server.inbox.wait_messages(before + 1, 2s));
  }
  net::flush_batched();   // nothing left: a no-op
  link->close();
  CHECK_FALSE(link->send('m', std::vector<char>{1}, Link::Send::Batched));   // a closed link takes nothing
}

TEST_CASE("links: a batched message to a peer that stopped reading blocks no thread, and leaves once it reads") {
  net::LinkOptions patient;
  patient.send_timeout = 60s;
  patient.silence_limit = 60s;
  Server server("secret", patient);
  Client client(server, patient);
  auto& link = client.link;
  auto& inbox = server.inbox;
  using net::Link;
  std::unique_lock held(server.gate);   // the server reads its first message, then nothing more
  REQUIRE(link->send('x', std::vector<char>{}));
  // A sender fills the socket and blocks in a write (holding the link's writer) until it reads.
  const auto chunk = pattern(256u << 10, 1);
  std::atomic<int> stuffed{0};
  std::thread stuffer([&] {
    for (int i = 0; i < 256; ++i) {   // 64 MiB: more than both sockets' buffers hold
      if (!link->send('s', chunk)) return;
      stuffed.fetch_add(1);
    }
  });
  for (int last = -1; stuffed.load() != last;) {   // until it has stopped making progress
    last = stuffed.load();
    std::this_thread::sleep_for(300ms);
  }
  const int stuffed_before = stuffed.load();
  REQUIRE(stuffed_before < 256);
  // Batched sends, and the flush a waiting caller makes, return at once: nothing waits for the
  // socket (a blocking write would hold this thread for the 60 s send timeout).
  const auto t0 = std::chrono::steady_clock::now();
  const auto small = pattern(100, 2);
  for (int i = 0; i < 10; ++i) REQUIRE(link->send('b', small, Link::Send::Batched));
  net::flush_batched();
  CHECK(std::chrono::steady_clock::now() - t0 < 10s);
  held.unlock();
  stuffer.join();
  REQUIRE(inbox.wait_messages(1 + 256 + 10, 30s));
  // Each sender's messages in its order; the batched ones after every chunk sent before them.
  std::lock_guard lk(inbox.mu);
  std::size_t chunks = 0, batched = 0, first_batched = 0;
  for (std::size_t i = 1; i < inbox.got.size(); ++i) {
    if (inbox.got[i].first == 's') {
      CHECK(inbox.got[i].second == chunk);
      ++chunks;
    } else {
      CHECK(inbox.got[i] == std::make_pair('b', small));
      if (batched++ == 0) first_batched = i;
    }
  }
  CHECK(chunks == 256);
  CHECK(batched == 10);
  CHECK(first_batched > std::size_t(stuffed_before));
}

TEST_CASE("links: a wrong or missing token, random bytes and a stalled handshake are refused, and only they") {
  net::LinkOptions quick;
  quick.handshake_timeout = 300ms;
  Server server("secret", quick);
  Inbox good_inbox;   // before its hub: the hub's stop runs the link's closed handler, which writes here
  net::LinkHub good("secret", net::self_identity("good"));
  auto link = good.connect(server.address, good_inbox.on_message(), good_inbox.on_closed(), 5s);

  for (const char* token : {"wrong", ""}) {
    net::LinkHub bad(token, net::self_identity("bad"));
    (void)refusal(bad, server.address, "a link without the cluster token was accepted");
  }
  {   // a client that is no troupe process at all
    Server other("another cluster's token");
    (void)refusal(good, other.address, "a server with another token was trusted");
  }
  int junk = raw_connect(server.address);
  auto noise = pattern(4096, 3);
  ::send(junk, noise.data(), noise.size(), MSG_NOSIGNAL);
  CHECK(closed_by_peer(junk));
  ::close(junk);
  int huge = raw_connect(server.address);   // a length far beyond the handshake's bound
  const unsigned char len[6] = {0xFF, 0xFF, 0xFF, 0x7F, 'B', 0};
  ::send(huge, len, sizeof len, MSG_NOSIGNAL);
  CHECK(closed_by_peer(huge));
  ::close(huge);
  int silent = raw_connect(server.address);   // connects, then says nothing: dropped at the timeout
  CHECK(closed_by_peer(silent, 5s));
  ::close(silent);

  REQUIRE(link->send('m', std::vector<char>{'s', 't', 'i', 'l', 'l'}));   // the good link is untouched
  REQUIRE(server.inbox.wait_messages(1));
  CHECK(server.inbox.got[0].second == std::vector<char>{'s', 't', 'i', 'l', 'l'});
  CHECK_FALSE(good_inbox.closed);
}

TEST_CASE("links: a peer of another wire version is refused either way round, the refusal naming both versions") {
  net::PeerIdentity later = net::self_identity("later");
  later.wire_version = net::kWireVersion + 1;
  const std::string theirs = "speaks troupe wire version " + std::to_string(net::kWireVersion + 1);
  const std::string ours = "this process " + std::to_string(net::kWireVersion);
  Server server("secret");
  {   // a later build connects: the server refuses it and says why
    net::LinkHub hub("secret", later);
    const std::string why = refusal(hub, server.address, "a peer of another wire version was linked");
    CHECK(why.find("wire version " + std::to_string(net::kWireVersion) + ",") != std::string::npos);
    CHECK(why.find("this process " + std::to_string(net::kWireVersion + 1)) != std::string::npos);
  }
  {   // this build connects to a later one's server
    Server other("secret", {}, later);
    net::LinkHub hub("secret", net::self_identity("client"));
    const std::string why = refusal(hub, other.address, "a server of another wire version was linked");
    CHECK(why.find(theirs) != std::string::npos);
    CHECK(why.find(ours) != std::string::npos);
    CHECK(other.inbox.got.empty());
  }
  Client same(server);   // the server still links its own version
  REQUIRE(same.link->send('m', std::vector<char>{'o', 'k'}));
  REQUIRE(server.inbox.wait_messages(1));
}

TEST_CASE("links: an idle link stays open on heartbeats, and a peer that falls silent is closed as frozen") {
  const auto fast = beating(40ms, 300ms);
  Server server("secret", fast);
  Inbox inbox;
  net::LinkHub client("secret", net::self_identity("client"), fast);
  auto link = client.connect(server.address, inbox.on_message(), inbox.on_closed(), 5s);
  CHECK_FALSE(inbox.wait_closed(900ms));   // three silence limits with nothing to say: still open
  CHECK_FALSE(server.inbox.closed);

  // The server's io thread stops (a handler that blocks, as a frozen process would): it neither
  // reads nor beats, and the client closes the link as frozen.
  std::unique_lock held(server.gate);
  REQUIRE(link->send('x', std::vector<char>{1}));
  REQUIRE(inbox.wait_closed(5s));
  CHECK(inbox.end == net::LinkEnd::Frozen);
  CHECK(inbox.why.find("silent") != std::string::npos);
  held.unlock();
}

TEST_CASE("links: both ends stopped together past the silence limit (one stopped process) keep their link") {
  // An embedded cluster's head, node and driver are hubs of one process: stopped (SIGSTOP, a VM
  // pause), none of them beats, and each finds the others silent when it resumes. Here both io
  // threads stop for three silence limits at once, in handlers that wait on the server's gate.
  // A heartbeat of 100 ms gives each end 50 ms after the resumption to be heard by the other.
  const auto fast = beating(100ms, 500ms);
  Server server("secret", fast);
  Inbox inbox;
  net::LinkHub client("secret", net::self_identity("client"), fast);
  auto link = client.connect(server.address, [&](net::Link& l, char kind, std::vector<char>& body) {
    std::lock_guard g(server.gate);
    inbox.on_message()(l, kind, body);
  }, inbox.on_closed(), 5s);
  REQUIRE(link != nullptr);
  {
    std::unique_lock held(server.gate);
    REQUIRE(link->send('x', std::vector<char>{1}));   // the server's io thread stops in its handler
    std::shared_ptr<net::Link> accepted;
    for (auto until = std::chrono::steady_clock::now() + 5s; !accepted && std::chrono::steady_clock::now() < until;) {
      {
        std::lock_guard lk(server.mu);
        if (!server.links.empty()) accepted = server.links.front();
      }
      std::this_thread::sleep_for(1ms);
    }
    REQUIRE(accepted != nullptr);
    REQUIRE(accepted->send('y', std::vector<char>{2}));   // and the client's in its own
    std::this_thread::sleep_for(1500ms);
  }
  // Resumed: each end's first tick finds the other silent for 1.5 s. Neither closes, and the link
  // carries messages both ways.
  CHECK_FALSE(inbox.wait_closed(1s));
  CHECK_FALSE(server.inbox.closed);
  REQUIRE(link->send('z', std::vector<char>{3}));
  CHECK(server.inbox.wait_messages(2, 5s));
  CHECK(inbox.wait_messages(1, 5s));
  CHECK_FALSE(inbox.closed);
}

TEST_CASE("links: a message of hundreds of megabytes does not starve the heartbeats of its link") {
  const auto strict = beating(20ms, 150ms);   // a silence far shorter than the transfer takes
  Server server("secret", strict);
  Inbox inbox;
  net::LinkHub client("secret", net::self_identity("client"), strict);
  auto link = client.connect(server.address, inbox.on_message(), inbox.on_closed(), 5s);
  const auto big = pattern(384u << 20, 11);
  const auto t0 = std::chrono::steady_clock::now();
  const bool sent = link->send('b', big);
  INFO("sent: " << sent << "; client: " << inbox.why << "; server: " << server.inbox.why);
  REQUIRE(server.inbox.wait_messages(1, 60s));
  REQUIRE(sent);
  MESSAGE("384 MiB in " << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() << " s");
  CHECK(server.inbox.got[0].second == big);
  CHECK_FALSE(inbox.closed);
  CHECK_FALSE(server.inbox.closed);
}

// ---- lanes --------------------------------------------------------------------------------------

namespace {

net::LinkOptions with_lane() {
  net::LinkOptions o;
  o.lane = true;
  return o;
}

// Until `link` sends by its lane, at most `t`.
bool wait_lane(const net::Link& link, std::chrono::milliseconds t = 5s) {
  for (const auto until = std::chrono::steady_clock::now() + t; std::chrono::steady_clock::now() < until;) {
    if (link.has_lane()) return true;
    std::this_thread::sleep_for(1ms);   // a test's look; the link itself waits for nothing
  }
  return link.has_lane();
}

struct Mapped {
  char* start;
  std::size_t size;
};

// This process's mappings of lane files (/proc/self/maps), in address order.
std::vector<Mapped> lane_mappings() {
  std::vector<Mapped> found;
  std::FILE* f = std::fopen("/proc/self/maps", "r");
  REQUIRE(f != nullptr);
  char line[512];
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::strstr(line, "memfd:troupe-lane") == nullptr) continue;
    char* dash = nullptr;
    const auto start = std::strtoull(line, &dash, 16), end = std::strtoull(dash + 1, nullptr, 16);
    found.push_back(Mapped{reinterpret_cast<char*>(start), std::size_t(end - start)});
  }
  std::fclose(f);
  return found;
}

// `client`'s first message, sent and taken, then its switch to a lane: this process's lane
// mappings, two more than `before` (the new file, mapped by each end; the newest last).
std::vector<Mapped> first_message_then_lane(Server& server, Client& client, std::size_t before) {
  REQUIRE(client.link->send('m', std::vector<char>{1}));
  REQUIRE(server.inbox.wait_messages(1));
  REQUIRE(wait_lane(*client.link));
  auto maps = lane_mappings();
  REQUIRE(maps.size() == before + 2);
  return maps;
}

// How many of the mapping's pages are in this process's memory (mincore).
std::size_t resident_pages(const Mapped& m) {
  const auto page = std::size_t(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> in((m.size + page - 1) / page);
  REQUIRE(::mincore(m.start, m.size, in.data()) == 0);
  std::size_t n = 0;
  for (auto c : in) n += c & 1;
  return n;
}

// The first `n` messages `inbox` got: kind 'm' with bodies 0..n-1 (4 bytes each, little-endian),
// with bodies of `big` between them where `big_every` says.
void check_sequence(Inbox& inbox, int n, const std::vector<char>& big, int big_every, std::size_t from = 0) {
  std::lock_guard lk(inbox.mu);
  std::size_t at = from;
  for (int i = 0; i < n; ++i) {
    REQUIRE(at < inbox.got.size());
    const auto& [kind, body] = inbox.got[at++];
    REQUIRE(kind == 'm');
    REQUIRE(body.size() == 4);
    int v = 0;
    std::memcpy(&v, body.data(), 4);
    REQUIRE(v == i);
    if (i % big_every == big_every - 1) {
      REQUIRE(at < inbox.got.size());
      CHECK(inbox.got[at].first == 'b');
      CHECK(inbox.got[at++].second == big);
    }
  }
}

void send_sequence(net::Link& link, int n, const std::vector<char>& big, int big_every) {
  for (int i = 0; i < n; ++i) {
    char b[4];
    std::memcpy(b, &i, 4);
    REQUIRE(link.send('m', b, 4, i % 2 == 0 ? net::Link::Send::Batched : net::Link::Send::Now));
    if (i % big_every == big_every - 1) REQUIRE(link.send('b', big));
  }
}

}  // namespace

TEST_CASE("links: same-host hubs that allow it move to a lane, in order across the switch, both ways, any size") {
  auto quiet = with_lane();
  quiet.heartbeat = 60s;   // nothing but the test's messages wakes an io thread
  const auto big = pattern(2621440 + 5, 3), huge = pattern(24u << 20, 4);
  Server server("secret", quiet);
  Client client(server, quiet);
  // The client's first message is a big one, sent while the lane is set up: its switch comes due
  // while the message goes out on the socket, and is made as it ends (the io thread never waits
  // for a transfer).
  REQUIRE(client.link->send('H', huge));
  std::shared_ptr<net::Link> accepted;
  for (int i = 0; i < 500 && !accepted; ++i) {
    {
      std::lock_guard lk(server.mu);
      if (!server.links.empty()) accepted = server.links[0];
    }
    if (!accepted) std::this_thread::sleep_for(1ms);
  }
  REQUIRE(accepted != nullptr);
  // Sent at once, both ways, so that the switch happens somewhere among them; a big message (two
  // and a half rings' worth, in chunks) every 500.
  constexpr int kN = 3000, kBigEvery = 500;
  std::thread back([&] { send_sequence(*accepted, kN, big, kBigEvery); });
  send_sequence(*client.link, kN, big, kBigEvery);
  back.join();
  const std::size_t total = kN + kN / kBigEvery;
  REQUIRE(server.inbox.wait_messages(total + 1, 30s));
  REQUIRE(client.inbox.wait_messages(total, 30s));
  {
    std::lock_guard lk(server.inbox.mu);
    CHECK(server.inbox.got[0].first == 'H');
    CHECK(server.inbox.got[0].second == huge);
  }
  check_sequence(server.inbox, kN, big, kBigEvery, 1);
  check_sequence(client.inbox, kN, big, kBigEvery);
  CHECK(wait_lane(*client.link));
  CHECK(wait_lane(*accepted));

  // A thread inside a LaneWatch takes the messages itself, here: their sender rings no doorbell,
  // so the client's io thread, parked by now, does not wake to take one.
  std::this_thread::sleep_for(20ms);   // past the io threads' linger
  std::atomic<int> here{0};
  const auto me = std::this_thread::get_id();
  client.link->set_handlers([&](net::Link&, char, std::vector<char>&) {
    if (std::this_thread::get_id() == me) ++here;
  }, client.inbox.on_closed());
  {
    net::LaneWatch watch;
    for (int i = 0; i < 20; ++i) {
      REQUIRE(accepted->send('p', std::vector<char>{char(i)}));
      for (const auto until = std::chrono::steady_clock::now() + 2s; std::chrono::steady_clock::now() < until;) {
        if (watch.drain() > 0) break;
      }
    }
  }
  CHECK(here.load() == 20);

  // A thread asleep in a LaneWatch is woken by the lane itself (its producer wakes it through the
  // file's futex) and takes the message here; its word, bumped by another thread, wakes it too;
  // and with neither it sleeps until its time.
  here = 0;
  {
    net::LaneWatch watch;
    std::atomic<std::uint32_t> word{0};
    std::thread sender([&] {
      std::this_thread::sleep_for(50ms);   // the sleep below has begun by then (if not, it sees the frame)
      CHECK(accepted->send('s', std::vector<char>{1}));
    });
    const auto t0 = std::chrono::steady_clock::now();
    std::size_t got = 0;
    while (got == 0 && std::chrono::steady_clock::now() - t0 < 10s) {
      REQUIRE(watch.sleep(word, 0, t0 + 10s));
      got += watch.drain();
    }
    sender.join();
    CHECK(got == 1);
    CHECK(here.load() == 1);
    CHECK(std::chrono::steady_clock::now() - t0 < 5s);   // woken, not timed out

    std::thread bumper([&] {
      std::this_thread::sleep_for(50ms);
      word.fetch_add(1);
      net::wake_word(word);
    });
    const auto t1 = std::chrono::steady_clock::now();
    while (word.load() == 0 && std::chrono::steady_clock::now() - t1 < 10s) REQUIRE(watch.sleep(word, 0, t1 + 10s));
    bumper.join();
    CHECK(word.load() == 1);
    CHECK(std::chrono::steady_clock::now() - t1 < 5s);

    const auto t2 = std::chrono::steady_clock::now();
    while (std::chrono::steady_clock::now() < t2 + 100ms) REQUIRE(watch.sleep(word, 1, t2 + 100ms));
    CHECK(watch.drain() == 0);
  }
  CHECK(here.load() == 1);

  // Of two threads asleep on the lane, each for a receiver of its own (an actor's host), a message
  // to one receiver wakes its thread, which takes it; the other sleeps on to its time.
  {
    std::mutex mu;
    std::thread::id took;
    client.link->set_handlers([&](net::Link&, char, std::vector<char>&) {
      std::lock_guard lk(mu);
      took = std::this_thread::get_id();
    }, client.inbox.on_closed());
    struct Sleeper {
      std::thread::id id;
      std::size_t got = 0;
      std::chrono::steady_clock::duration slept{};
    };
    auto sleep_for_receiver = [](Sleeper& s, std::uint64_t receiver, std::chrono::steady_clock::time_point until) {
      net::LaneWatch watch;
      std::atomic<std::uint32_t> word{0};
      s.id = std::this_thread::get_id();
      const auto t = std::chrono::steady_clock::now();
      while (s.got == 0 && std::chrono::steady_clock::now() < until) {
        if (!watch.sleep(word, 0, until, receiver)) break;
        s.got += watch.drain();
      }
      s.slept = std::chrono::steady_clock::now() - t;
    };
    Sleeper seven, nine;
    const auto start = std::chrono::steady_clock::now();
    std::thread a([&] { sleep_for_receiver(seven, 7, start + 1500ms); });
    std::thread b([&] { sleep_for_receiver(nine, 9, start + 10s); });
    std::this_thread::sleep_for(100ms);   // both asleep by then (if not, the one for 9 sees the message)
    REQUIRE(accepted->send('t', std::vector<char>{9}, net::Link::Send::Now, 9));
    b.join();
    a.join();
    CHECK(nine.got == 1);
    CHECK(nine.slept < 1400ms);   // woken, long before its time and before the other's
    CHECK(seven.got == 0);
    CHECK(seven.slept >= 1400ms);
    std::lock_guard lk(mu);
    CHECK(took == nine.id);
  }

  // Its end reads as on a socket: the peer closed it, and its process runs on.
  client.link->close();
  REQUIRE(server.inbox.wait_closed(5s));
  CHECK(server.inbox.end == net::LinkEnd::Lost);
  CHECK_FALSE(client.link->send('m', std::vector<char>{1}));
}

TEST_CASE("links: a hub that does not allow lanes refuses one, and so does TROUPE_LINK_LANE=0, and messages stay on the socket") {
  SUBCASE("the acceptor refuses") {
    Server server("secret");   // lanes not allowed
    Client client(server, with_lane());
    const auto big = pattern(700000, 5);
    send_sequence(*client.link, 400, big, 100);
    REQUIRE(server.inbox.wait_messages(404));
    check_sequence(server.inbox, 400, big, 100);
    CHECK_FALSE(client.link->has_lane());
  }
  SUBCASE("the environment turns them off") {
    const char* was = std::getenv("TROUPE_LINK_LANE");
    const std::string before = was != nullptr ? was : "";
    ::setenv("TROUPE_LINK_LANE", "0", 1);
    Server server("secret", with_lane());
    Client client(server, with_lane());
    if (was != nullptr) ::setenv("TROUPE_LINK_LANE", before.c_str(), 1);
    else ::unsetenv("TROUPE_LINK_LANE");
    send_sequence(*client.link, 100, {}, 1000);
    REQUIRE(server.inbox.wait_messages(100));
    check_sequence(server.inbox, 100, {}, 1000);
    CHECK_FALSE(client.link->has_lane());
  }
}

TEST_CASE("links: a lane's file is in memory in both its mappings before a message touches its rings") {
  // A page first touched by a message costs a page fault on that message's way (Mapping::map).
  const auto before = lane_mappings().size();
  Server server("secret", with_lane());
  Client client(server, with_lane());
  const auto maps = first_message_then_lane(server, client, before);
  const auto page = std::size_t(::sysconf(_SC_PAGESIZE));
  for (const auto& m : maps) {
    CHECK(m.size > (2u << 20));   // a header page and two rings of 1 MiB
    CHECK(resident_pages(m) == m.size / page);   // one message touched a page or two of them
  }
}

TEST_CASE("lanes: a file of another layout (a peer of another build) is refused, one of this build's is opened") {
  namespace lane = net::lane;
  auto made = lane::Mapping::create(lane::kCapacity);
  CHECK(lane::Mapping::open(std::uint32_t(::getpid()), made->fd(), made->magic(), made->capacity()) != nullptr);
  // The header: magic (16 bytes), capacity (8), the layout word, then the rings' words from byte 64.
  char* header = reinterpret_cast<char*>(&made->control(0)) - 64;
  auto* layout = reinterpret_cast<std::uint32_t*>(header + 24);
  REQUIRE(*layout == lane::kLayout);
  *layout = 0;   // a file of a build before the word
  try {
    lane::Mapping::open(std::uint32_t(::getpid()), made->fd(), made->magic(), made->capacity());
    FAIL("a lane of another layout was opened");
  } catch (const std::runtime_error& e) {
    CHECK(std::string(e.what()).find("layout 0") != std::string::npos);
  }
}

TEST_CASE("lanes: a frame that finds its ring empty goes back to the ring's start behind a skip, and only then") {
  namespace lane = net::lane;
  auto map = lane::Mapping::create(lane::kCapacity);
  lane::Producer out(map, 0);
  lane::Consumer in(map, 0);
  const std::atomic<bool> stop{false};
  const auto cap = lane::kCapacity, head = std::uint64_t(net::kFrameHeader);
  auto put = [&](const std::vector<char>& body) {
    iovec part{const_cast<char*>(body.data()), body.size()};
    char header[net::kFrameHeader];
    net::put_header(header, std::uint32_t(body.size()), 'm', 0);
    iovec parts[2] = {{header, sizeof header}, part};
    const auto r = out.put(parts, 2, sizeof header + body.size(), std::chrono::steady_clock::now() + 5s, stop);
    REQUIRE((r == lane::Producer::Put::Ok || r == lane::Producer::Put::Ring));
  };
  auto take = [&](const std::vector<char>& want) {
    char kind = 0;
    std::uint8_t flags = 0;
    std::vector<char> got;
    REQUIRE(in.next(1u << 20, kind, flags, got) == lane::Consumer::Got::Frame);
    CHECK(kind == 'm');
    CHECK(got == want);
  };
  const auto a = pattern(100000, 1), b = pattern(50000, 2), c = pattern(60000, 3), d = pattern(10, 4);
  put(a);   // at the ring's start: nothing to skip
  CHECK(in.published() == head + a.size());
  take(a);
  put(b);   // the ring is empty and b fits before a's end: back to the start
  CHECK(in.published() == cap + head + b.size());
  take(b);
  CHECK_FALSE(in.pending());
  put(c);   // empty, but c does not fit before b's end: on from there
  CHECK(in.published() == cap + 2 * head + b.size() + c.size());
  put(d);   // c not taken yet: on behind it, though d would fit
  CHECK(in.published() == cap + 3 * head + b.size() + c.size() + d.size());
  take(c);
  take(d);
  put(d);   // empty again: back to the start
  CHECK(in.published() == 2 * cap + head + d.size());
  take(d);
  char kind = 0;
  std::uint8_t flags = 0;
  std::vector<char> got;
  CHECK(in.next(1u << 20, kind, flags, got) == lane::Consumer::Got::None);
  SUBCASE("a skip that does not end at the ring's end, or with no frame behind it, is malformed") {
    put(a);   // ring offset 16 + 100006: the next goes from there
    take(a);
    // Written by hand where the next frame would go: a skip of 64 bytes, then a frame.
    const std::uint64_t at = in.published() % cap;
    char* ring = map->data(0);
    net::put_header(ring + at, 64, lane::kSkip, 0);
    net::put_header(ring + at + head + 64, 1, 'm', 0);
    const std::uint64_t taken = in.published();
    map->control(0).head.store(taken + 2 * head + 64 + 1);
    CHECK(in.next(1u << 20, kind, flags, got) == lane::Consumer::Got::Broken);
    // One that ends at the ring's end, with nothing published behind it.
    net::put_header(ring + at, std::uint32_t(cap - at - head), lane::kSkip, 0);
    map->control(0).head.store(taken + (cap - at));
    CHECK(in.next(1u << 20, kind, flags, got) == lane::Consumer::Got::Broken);
  }
}

TEST_CASE("links: a lane whose rings were written over closes its link alone, and a peer that stops taking times a sender out") {
  SUBCASE("a ring's head past its size") {
    const auto before = lane_mappings().size();
    Server server("secret", with_lane());
    Client victim(server, with_lane());
    const auto maps = first_message_then_lane(server, victim, before);
    Client other(server, with_lane());    // a second link to the same hub: it must stay open
    REQUIRE(wait_lane(*other.link));
    // The client-to-server ring's head (header: magic, capacity, then each ring's words on
    // 64-byte lines, the head first): far past anything published.
    auto* head = reinterpret_cast<std::atomic<std::uint64_t>*>(maps.back().start + 64);
    head->store(std::uint64_t(1) << 40);
    {
      net::LaneWatch watch;   // whoever looks next finds it: here, this thread
      watch.drain();
    }
    REQUIRE(server.inbox.wait_closed(5s));
    CHECK(server.inbox.why.find("malformed") != std::string::npos);
    REQUIRE(victim.inbox.wait_closed(5s));
    REQUIRE(other.link->send('o', std::vector<char>{2}));
    REQUIRE(server.inbox.wait_messages(2));
    CHECK(server.inbox.got.back().first == 'o');
    CHECK_FALSE(other.link->closed());
  }
  SUBCASE("a frozen consumer") {
    net::LinkOptions o = with_lane();
    o.send_timeout = 300ms;
    Server server("secret", o);
    Client client(server, o);
    REQUIRE(client.link->send('m', std::vector<char>{1}));
    REQUIRE(server.inbox.wait_messages(1));
    REQUIRE(wait_lane(*client.link));
    std::unique_lock held(server.gate);   // the server's next handler stops: nothing more is taken
    const std::vector<char> chunk(64u << 10, 'x');
    bool refused = false;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 64 && !refused; ++i) refused = !client.link->send('f', chunk);   // 4 MiB > the ring
    CHECK(refused);
    CHECK(client.link->closed());
    CHECK(std::chrono::steady_clock::now() - t0 < 10s);   // the timeout's 300 ms, not forever
    held.unlock();
  }
}

// A link this side closes for a fault (here: a message its handler refused) may have a live peer:
// it ends Lost, by lane as by socket, so that its users link again (cluster::ClusterClient); one
// closed on purpose ends Closed. Before, a refusal taken from a lane ended Closed (close() ran
// before the read loop saw the end), and the client then ignored it: its actors' calls waited
// out their deadlines.
TEST_CASE("links: a link closed here for a fault ends Lost, by lane as by socket, and one closed on purpose ends Closed") {
  for (const bool lane : {false, true}) {
    CAPTURE(lane);
    Inbox inbox;
    std::mutex mu;
    std::vector<std::shared_ptr<net::Link>> accepted;
    net::LinkHub server("secret", net::self_identity("server"), lane ? with_lane() : net::LinkOptions{});
    const auto address = server.listen("127.0.0.1", [&](const std::shared_ptr<net::Link>& l) {
      l->set_handlers([deliver = inbox.on_message()](net::Link& link, char kind, std::vector<char>& body) {
        if (kind == 'x') throw std::runtime_error("no 'x' messages here");
        deliver(link, kind, body);
      }, inbox.on_closed());
      std::lock_guard lk(mu);
      accepted.push_back(l);
    });
    Inbox client_inbox;
    net::LinkHub client("secret", net::self_identity("client"), lane ? with_lane() : net::LinkOptions{});
    auto link = client.connect(address, client_inbox.on_message(), client_inbox.on_closed(), 5s);
    REQUIRE(link != nullptr);
    REQUIRE(link->send('m', std::vector<char>{1}));
    REQUIRE(inbox.wait_messages(1));
    if (lane) REQUIRE(wait_lane(*link));
    CHECK(link->has_lane() == lane);
    REQUIRE(link->send('x', std::vector<char>{2}));
    REQUIRE(inbox.wait_closed(5s));
    CHECK(inbox.end == net::LinkEnd::Lost);
    CHECK(inbox.why.find("no 'x' messages here") != std::string::npos);
    REQUIRE(client_inbox.wait_closed(5s));   // the peer's end: Lost too (it closed; this process runs on)
    CHECK(client_inbox.end == net::LinkEnd::Lost);
  }
  Server server("secret", with_lane());
  Client client(server, with_lane());
  REQUIRE(client.link->send('m', std::vector<char>{1}));
  REQUIRE(server.inbox.wait_messages(1));
  REQUIRE(wait_lane(*client.link));
  client.link->close("done with it");
  REQUIRE(client.inbox.wait_closed(5s));
  CHECK(client.inbox.end == net::LinkEnd::Closed);
}
