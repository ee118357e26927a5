// Peers in one process, over real links on 127.0.0.1: calls reach their hosts and come back in
// order, a call for another incarnation or an actor not hosted here is answered ActorDied (FT-2),
// a link its peer closed reads as Lost, and a call made on an ended link waits for the next bind.
#include <doctest/doctest.h>

#include <caf/all.hpp>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "actor_cell.hpp"
#include "actor_host.hpp"
#include "cluster/peers.hpp"
#include "cluster/remote_route.hpp"
#include "cluster/wire.hpp"
#include "runtime_impl.hpp"
#include "troupe/future.hpp"
#include "troupe/transport/descriptor.hpp"

namespace cl = troupe::cluster;
namespace d = troupe::detail;
using namespace std::chrono_literals;

namespace {

// A host that answers each call with its one int argument times ten, a negative one -x ms late.
// (The unused int: CAF 0.17 spawns an argument-less function actor through a null tuple pointer,
// which UBSan flags.)
caf::behavior tenfold_host(caf::event_based_actor*, int) {
  return {[](d::ChannelCall& cc) {
    d::WireReply r;
    r.actor_id = cc.call.actor_id;
    r.incarnation = cc.call.incarnation;
    r.seq = cc.call.seq;
    auto [x] = troupe::decode_args<int>(troupe::Payload{cc.call.args, {}});
    if (x < 0) std::this_thread::sleep_for(std::chrono::milliseconds(-x));
    r.result = troupe::encode_value(x * 10).bytes;
    cc.sink->reply(r, false);
  }};
}

struct Losses {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<troupe::net::LinkEnd> ends;
  cl::Peers::LossHandler handler() {
    return [this](const troupe::net::Link&, troupe::net::LinkEnd end, const std::string&) {
      std::lock_guard lk(mu);
      ends.push_back(end);
      cv.notify_all();
    };
  }
  bool wait(std::size_t n) {
    std::unique_lock lk(mu);
    return cv.wait_for(lk, 10s, [&] { return ends.size() >= n; });
  }
};

struct Fixture {
  d::RuntimeImpl rt{troupe::RuntimeConfig{}};
  d::DeadlineTimer timer;
  cl::Peers server{rt, "secret", "server"};
  cl::Peers client{rt, "secret", "client"};
  std::string address = server.listen("127.0.0.1");
  std::shared_ptr<d::LocalRoute> host =
      std::make_shared<d::LocalRoute>(rt.system().spawn(tenfold_host, 0), std::make_shared<d::HostedObject>());

  std::shared_ptr<d::ActorCell> cell(std::uint64_t id, int retries = 0) {
    auto c = std::make_shared<d::ActorCell>(d::CellSpec{id, "T", "T#" + std::to_string(id), 30s, retries, true},
                                            d::CallTableEnv{&timer, &d::release_regions});
    rt.add_cell(c);   // replies find their cell in the runtime's table
    return c;
  }
  // Actor 7 (incarnation 3) hosted by the server, and a cell of the client's bound to it over the
  // client's link to the server: the link and the cell.
  std::pair<std::shared_ptr<troupe::net::Link>, std::shared_ptr<d::ActorCell>> served_seven() {
    server.host(7, 3, host);
    auto link = client.link_to(address);
    REQUIRE(link != nullptr);
    auto c = cell(7);
    c->bind(std::make_shared<cl::LinkRoute>(7, 3, link));
    return {link, c};
  }
  troupe::Future<int> call(const std::shared_ptr<d::ActorCell>& c, int x) {
    troupe::Promise<int> p;
    c->submit("m", troupe::encode_args(x), p.state(), 0ns);
    return p.future();
  }
  ~Fixture() {
    client.stop();
    server.stop();
    caf::anon_send_exit(host->host(), caf::exit_reason::user_shutdown);
  }
};

}  // namespace

TEST_CASE("peers: calls reach their host over a link and are answered in order, and FT-2 holds") {
  Fixture f;
  f.server.host(7, 3, f.host);
  auto link = f.client.link_to(f.address);
  REQUIRE(link != nullptr);
  CHECK(f.client.link_to(f.address) == link);   // one link per peer process
  auto c = f.cell(7);
  c->bind(std::make_shared<cl::LinkRoute>(7, 3, link));
  std::vector<troupe::Future<int>> fs;
  for (int i = 0; i < 200; ++i) fs.push_back(f.call(c, i));
  for (int i = 0; i < 200; ++i) CHECK(fs[std::size_t(i)].get() == 10 * i);

  f.server.host(9, 1, f.host);
  auto stale = f.cell(9);   // incarnation 2 of actor 9 is not the one hosted there
  stale->bind(std::make_shared<cl::LinkRoute>(9, 2, link));
  auto unknown = f.cell(8);
  unknown->bind(std::make_shared<cl::LinkRoute>(8, 1, link));
  for (auto* x : {&stale, &unknown}) {
    auto r = f.call(*x, 1).result();
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().code == troupe::ErrorCode::ActorDied);
    CHECK(r.error().message.find("not hosted here") != std::string::npos);
  }
  f.server.unhost(7);   // killed here: its next call is refused the same way
  CHECK(f.call(c, 1).result().error().code == troupe::ErrorCode::ActorDied);
}

TEST_CASE("peers: a link its live peer closed reads as Lost, and a call made on it waits for the next bind") {
  Fixture f;
  Losses losses;
  f.client.on_loss(losses.handler());
  f.server.host(7, 3, f.host);
  auto first = f.client.link_to(f.address);
  REQUIRE(first != nullptr);
  auto c = f.cell(7);
  c->bind(std::make_shared<cl::LinkRoute>(7, 3, first));
  CHECK(f.call(c, 1).get() == 10);

  f.server.stop();   // the serving side closes its links; this process (the peer) lives on
  REQUIRE(losses.wait(1));
  CHECK(losses.ends[0] == troupe::net::LinkEnd::Lost);
  auto waiting = f.call(c, 2);   // on the ended link: not sent, kept for the next bind
  CHECK_FALSE(waiting.wait_for(200ms));

  cl::Peers again{f.rt, "secret", "server again"};
  auto address = again.listen("127.0.0.1");
  again.host(7, 3, f.host);
  auto second = f.client.link_to(address);
  REQUIRE(second != nullptr);
  c->unbind(3, "its link ended");   // what the cluster client does once the head has its word
  c->bind(std::make_shared<cl::LinkRoute>(7, 3, second));
  CHECK(waiting.get() == 20);
  f.client.on_loss(nullptr);
  again.stop();
}

TEST_CASE("peers: a reply is taken whenever it comes, far from when the method's recent replies came") {
  // A call table expects each reply about when the method's recent ones came, and its waiter sleeps
  // until shortly before that: a reply much later, or much earlier, must still be taken at once.
  Fixture f;
  const auto [link, c] = f.served_seven();
  for (int i = 0; i < 10; ++i) CHECK(f.call(c, i).get() == 10 * i);   // quick: expected within microseconds
  CHECK(f.call(c, -300).get() == -3000);                              // far later than expected
  for (int i = 0; i < 6; ++i) CHECK(f.call(c, -250).get() == -2500);  // now expected ~250 ms after sending
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(f.call(c, 5).get() == 50);                                     // far earlier than expected
  CHECK(std::chrono::steady_clock::now() - t0 < 150ms);                // taken when it came, not near 250 ms
}

TEST_CASE("peers: once a same-host link has its lane, tensors up to kLaneInlineMaxBytes go in the message") {
  namespace tp = troupe::transport;
  Fixture f;
  const auto [link, c] = f.served_seven();
  CHECK(f.call(c, 1).get() == 10);
  for (int i = 0; i < 500 && !link->has_lane(); ++i) std::this_thread::sleep_for(10ms);
  REQUIRE(link->has_lane());
  CHECK(d::inline_limit(*link) == tp::kLaneInlineMaxBytes);
  auto t = troupe::TensorView::empty(troupe::DType::U8, {300 << 10});   // past a socket's 64 KiB
  std::fill_n(t.data_as<unsigned char>(), t.nbytes(), 7);
  auto by_lane = troupe::encode_value(t);
  const auto w = d::to_wire(by_lane, d::inline_limit(*link));
  REQUIRE(w.tensors.size() == 1);
  CHECK(w.regions.empty());   // nothing exposed for the peer to pull
  const auto inl = tp::decode_descriptor(w.tensors[0]);
  CHECK(inl.is_inline);
  CHECK(inl.inline_bytes == std::vector<char>(300 << 10, 7));
  auto by_socket = troupe::encode_value(t);
  const auto s = d::to_wire(by_socket);   // a socket's limit: by the data plane
  REQUIRE(s.tensors.size() == 1);
  CHECK_FALSE(tp::decode_descriptor(s.tensors[0]).is_inline);
  CHECK(s.regions.size() == 1);
  d::release_regions(s.regions);
}
