// The call table (ActorCell) against fake routes and a manual clock: no CAF, no socket, no sleep.
// FT-1: every future resolves by its deadline; FT-2: a reply from an older incarnation is
// ignored; lost attempts are resent in submission order while max_retries allows, then fail;
// death fails every call in flight; a broken route hands its calls to its fallback.
#include <doctest/doctest.h>

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "actor_cell.hpp"
#include "deadline_timer.hpp"
#include "route.hpp"
#include "troupe/future.hpp"

namespace d = troupe::detail;
using troupe::ErrorCode;
using namespace std::chrono_literals;

namespace {

// Fires deadlines only when told: fire_until(t) runs every entry due at or before t.
class ManualTimer final : public d::Timer {
 public:
  Key schedule(Clock::time_point when, std::function<void()> fire) override {
    std::lock_guard lk(mu_);
    Key key{when, next_++};
    entries_.emplace(key, std::move(fire));
    return key;
  }
  void cancel(const Key& key) override {
    std::lock_guard lk(mu_);
    entries_.erase(key);
  }
  void fire_until(Clock::time_point t) {
    for (;;) {
      std::function<void()> fire;
      {
        std::lock_guard lk(mu_);
        if (entries_.empty() || entries_.begin()->first.first > t) return;
        fire = std::move(entries_.begin()->second);
        entries_.erase(entries_.begin());
      }
      fire();
    }
  }
  std::size_t pending() {
    std::lock_guard lk(mu_);
    return entries_.size();
  }

 private:
  std::mutex mu_;
  std::map<Key, std::function<void()>> entries_;
  std::uint64_t next_ = 1;
};

// A route that records every attempt and answers none by itself; each attempt exposes one region.
class FakeRoute final : public d::Route {
 public:
  explicit FakeRoute(std::uint64_t incarnation, bool local = false, std::shared_ptr<d::Route> fallback = nullptr)
      : incarnation_(incarnation), local_(local), fallback_(std::move(fallback)) {}
  std::uint64_t incarnation() const override { return incarnation_; }
  bool local() const override { return local_; }
  d::Sent send(d::Attempt&& a) override {
    seqs.push_back(a.seq);
    methods.emplace_back(a.method);
    states.push_back(a.state);
    args.push_back(std::move(a.args));
    if (local_) return d::Sent{this, {}, {}};
    return d::Sent{this, {next_region++}, {}};
  }
  std::shared_ptr<d::Route> fallback() const override { return fallback_; }
  void stop() override { ++stops; }

  std::vector<std::uint64_t> seqs;
  std::vector<std::string> methods;
  std::vector<std::shared_ptr<d::StateBase>> states;
  std::vector<troupe::Payload> args;
  std::uint64_t next_region = 1;
  int stops = 0;

 private:
  std::uint64_t incarnation_;
  bool local_;
  std::shared_ptr<d::Route> fallback_;
};

std::vector<std::uint64_t> g_released;   // every region the table released, in order
void count_release(const std::vector<std::uint64_t>& regions) {
  g_released.insert(g_released.end(), regions.begin(), regions.end());
}

struct Table {
  ManualTimer timer;
  std::shared_ptr<d::ActorCell> cell;
  explicit Table(int max_retries = 0, std::chrono::nanoseconds default_timeout = 0ns) {
    g_released.clear();
    cell = std::make_shared<d::ActorCell>(d::CellSpec{7, "T", "T#7", default_timeout, max_retries, true},
                                          d::CallTableEnv{&timer, &count_release});
  }
  troupe::Future<int> call(const char* method = "m", std::chrono::nanoseconds timeout = 0ns) {
    troupe::Promise<int> p;
    cell->submit(method, troupe::encode_args(1), p.state(), timeout);
    return p.future();
  }
  // The reply of (incarnation, seq) as a remote route delivers it.
  bool reply(std::uint64_t incarnation, std::uint64_t seq, int value) {
    auto state = cell->take_reply(incarnation, seq);
    if (!state) return false;
    state->complete_from(troupe::encode_value(value));
    return true;
  }
};

}  // namespace

TEST_CASE("call table: every future resolves by its deadline, and none before it (FT-1)") {
  Table t(0, 1s);   // the cell's default deadline: 1 s
  auto route = std::make_shared<FakeRoute>(1);
  t.cell->bind(route);
  std::vector<troupe::Future<int>> calls;
  for (int i = 0; i < 5; ++i) calls.push_back(t.call("slow"));
  calls.push_back(t.call("slower", 5s));   // its own deadline wins
  REQUIRE(route->seqs.size() == 6);
  t.timer.fire_until(d::Timer::Clock::now() + 500ms);
  for (auto& f : calls) CHECK_FALSE(f.ready());
  t.timer.fire_until(d::Timer::Clock::now() + 2s);
  for (int i = 0; i < 5; ++i) {
    REQUIRE(calls[i].ready());
    CHECK(calls[i].result().error().code == ErrorCode::Timeout);
    CHECK(calls[i].result().error().message == "T#7.slow took longer than 1000 ms");
  }
  CHECK_FALSE(calls[5].ready());
  t.timer.fire_until(d::Timer::Clock::now() + 6s);
  CHECK(calls[5].result().error().code == ErrorCode::Timeout);
  CHECK(g_released == std::vector<std::uint64_t>{1, 2, 3, 4, 5, 6});   // each attempt's regions, once
  CHECK_FALSE(t.reply(1, 1, 42));   // a late reply finds nothing to complete
}

TEST_CASE("call table: a completed call cancels its deadline") {
  Table t(0, 1s);
  auto route = std::make_shared<FakeRoute>(1);
  t.cell->bind(route);
  auto f = t.call();
  CHECK(t.timer.pending() == 1);
  REQUIRE(t.reply(1, route->seqs[0], 42));
  CHECK(f.get() == 42);
  CHECK(t.timer.pending() == 0);
  CHECK(g_released == std::vector<std::uint64_t>{1});
}

TEST_CASE("call table: a reply from an older incarnation is ignored (FT-2)") {
  Table t(1);
  auto first = std::make_shared<FakeRoute>(1);
  t.cell->bind(first);
  auto f = t.call();
  REQUIRE(first->seqs.size() == 1);
  const auto seq = first->seqs[0];
  t.cell->unbind(1, "its process died");   // a retry is left: queued for the next incarnation
  CHECK_FALSE(f.ready());
  auto second = std::make_shared<FakeRoute>(2);
  t.cell->bind(second);
  REQUIRE(second->seqs == std::vector<std::uint64_t>{seq});
  CHECK_FALSE(t.reply(1, seq, 1));   // the dead incarnation's reply
  CHECK_FALSE(f.ready());
  REQUIRE(t.reply(2, seq, 2));
  CHECK(f.get() == 2);
  CHECK_FALSE(t.reply(2, seq, 3));   // answered once
}

TEST_CASE("call table: lost attempts are resent in submission order while max_retries allows, then fail") {
  Table t(1);
  auto r1 = std::make_shared<FakeRoute>(1);
  t.cell->bind(r1);
  std::vector<troupe::Future<int>> calls;
  for (int i = 0; i < 4; ++i) calls.push_back(t.call());
  REQUIRE(r1->seqs == std::vector<std::uint64_t>{1, 2, 3, 4});
  REQUIRE(t.reply(1, 2, 20));   // one answered before the death
  t.cell->unbind(1, "lost its worker process");
  auto later = t.call();   // no route: it queues behind the resends
  auto r2 = std::make_shared<FakeRoute>(2);
  t.cell->bind(r2);
  CHECK(r2->seqs == std::vector<std::uint64_t>{1, 3, 4, 5});   // resends first, in order, then the new one
  CHECK(calls[1].get() == 20);

  t.cell->unbind(2, "lost its worker process again");   // calls 1, 3, 4 used their retry
  for (int i : {0, 2, 3}) {
    REQUIRE(calls[i].ready());
    CHECK(calls[i].result().error().code == ErrorCode::ActorDied);
    CHECK(calls[i].result().error().message == "T#7 lost its worker process again");
  }
  CHECK_FALSE(later.ready());   // its first attempt was lost: one retry left
  auto r3 = std::make_shared<FakeRoute>(3);
  t.cell->bind(r3);
  CHECK(r3->seqs == std::vector<std::uint64_t>{5});
}

TEST_CASE("call table: without retries, an attempt lost with its process fails with ActorDied") {
  Table t(0);
  auto r1 = std::make_shared<FakeRoute>(1);
  t.cell->bind(r1);
  auto f = t.call();
  t.cell->unbind(2, "not this incarnation");   // another incarnation's death changes nothing
  CHECK_FALSE(f.ready());
  t.cell->unbind(1, "was restarted");
  CHECK(f.result().error().code == ErrorCode::ActorDied);
  CHECK(g_released == std::vector<std::uint64_t>{1});
}

TEST_CASE("call table: a kill fails every call in flight and every later one, and stops the route") {
  Table t(3, 10s);
  auto route = std::make_shared<FakeRoute>(1);
  t.cell->bind(route);
  std::vector<troupe::Future<int>> calls;
  for (int i = 0; i < 3; ++i) calls.push_back(t.call());
  CHECK(t.cell->mark_dead("was killed"));
  CHECK_FALSE(t.cell->mark_dead("was killed twice"));
  for (auto& f : calls) {
    REQUIRE(f.ready());
    CHECK(f.result().error().code == ErrorCode::ActorDied);
    CHECK(f.result().error().message == "T#7 was killed");
  }
  CHECK(route->stops == 1);
  CHECK(t.timer.pending() == 0);
  CHECK(g_released == std::vector<std::uint64_t>{1, 2, 3});
  auto after = t.call();
  REQUIRE(after.ready());
  CHECK(after.result().error().code == ErrorCode::ActorDied);
  CHECK(route->seqs.size() == 3);   // never sent
  CHECK(t.cell->ready().result().error().code == ErrorCode::ActorDied);
}

TEST_CASE("call table: calls made before the first bind are sent at it, in order, before newer ones") {
  Table t(0);
  auto a = t.call("a"), b = t.call("b");
  auto route = std::make_shared<FakeRoute>(0, /*local=*/true);
  t.cell->bind(route);
  auto c = t.call("c");
  CHECK(route->methods == std::vector<std::string>{"a", "b", "c"});
  // A local route completes through the cell, by the state it was handed.
  t.cell->complete(*route->states[1], troupe::encode_value(2));
  t.cell->fail_call(*route->states[2], troupe::Error{ErrorCode::MethodFailed, "no"});
  CHECK(b.get() == 2);
  CHECK(c.result().error().code == ErrorCode::MethodFailed);
  CHECK_FALSE(a.ready());
  t.cell->complete(*route->states[2], troupe::encode_value(3));   // done already: ignored
  CHECK(c.result().error().message == "no");
}

TEST_CASE("call table: a method's expected reply time is its last runs' median: a slow first run is forgotten after two") {
  Table t(0);
  auto route = std::make_shared<FakeRoute>(0, /*local=*/true);
  t.cell->bind(route);
  CHECK(t.cell->typical_reply_time("m") == 0ns);   // none timed yet
  auto run = [&](std::chrono::nanoseconds ran) {   // a call of m whose host ran it this long
    auto f = t.call("m");
    REQUIRE(route->states.size() >= 1);
    t.cell->complete(*route->states.back(), troupe::encode_value(1), "m", ran);
    CHECK(f.get() == 1);
  };
  run(100ms);   // a cold first run
  CHECK(t.cell->typical_reply_time("m") == 100ms);
  run(1ms);     // of two, the shorter
  CHECK(t.cell->typical_reply_time("m") == 1ms);
  run(2ms);
  run(1ms);
  CHECK(t.cell->typical_reply_time("m") == 1ms);   // {100, 1, 2, 1}: the shorter middle one
  run(3ms);
  CHECK(t.cell->typical_reply_time("m") == 2ms);   // {100, 1, 2, 1, 3}
  // A change of pace is followed after three runs (of the five kept), and the oldest drop out.
  run(10ms);
  run(10ms);
  CHECK(t.cell->typical_reply_time("m") == 3ms);   // {2, 1, 3, 10, 10}
  run(10ms);
  CHECK(t.cell->typical_reply_time("m") == 10ms);   // {1, 3, 10, 10, 10}
  CHECK(t.cell->typical_reply_time("other") == 0ns);
}

TEST_CASE("call table: a route that breaks under a live actor hands its calls to its fallback") {
  Table t(0);
  auto fallback = std::make_shared<FakeRoute>(1);
  auto channel = std::make_shared<FakeRoute>(1, false, fallback);
  auto once = t.call("once");   // queued, then sent on the channel at bind
  t.cell->bind(channel);
  CHECK(channel->seqs == std::vector<std::uint64_t>{1});
  t.cell->route_broken(fallback.get(), "not the bound route");   // ignored
  CHECK_FALSE(once.ready());
  t.cell->route_broken(channel.get(), "lost its call channel");
  REQUIRE(once.ready());   // no retry: it may have run, so it is not sent again
  CHECK(once.result().error().code == ErrorCode::Unavailable);
  CHECK(once.result().error().message == "T#7 lost its call channel (the call may have run)");
  auto next = t.call("next");
  CHECK(fallback->methods == std::vector<std::string>{"next"});
  REQUIRE(t.reply(1, fallback->seqs[0], 9));
  CHECK(next.get() == 9);

  Table r(1);
  auto fb = std::make_shared<FakeRoute>(4);
  auto ch = std::make_shared<FakeRoute>(4, false, fb);
  r.cell->bind(ch);
  auto retried = r.call("retried");
  r.cell->route_broken(ch.get(), "lost its call channel");
  CHECK(fb->methods == std::vector<std::string>{"retried"});   // resent at once, on the fallback
  REQUIRE(r.reply(4, fb->seqs[0], 5));
  CHECK(retried.get() == 5);
}

TEST_CASE("call table: an attempt that cannot be sent fails its call with the route's error") {
  class Refusing final : public d::Route {
   public:
    std::uint64_t incarnation() const override { return 1; }
    bool local() const override { return false; }
    d::Sent send(d::Attempt&&) override {
      return d::Sent{nullptr, {77}, troupe::Error{ErrorCode::Unavailable, "could not send tensor arguments"}};
    }
  };
  Table t(2);
  t.cell->bind(std::make_shared<Refusing>());
  auto f = t.call();
  REQUIRE(f.ready());
  CHECK(f.result().error().code == ErrorCode::Unavailable);
  CHECK(g_released == std::vector<std::uint64_t>{77});
}

TEST_CASE("call table: a reply that comes while bind is still sending the queued calls completes its call") {
  // The reply of a queued call can arrive before bind() publishes the route (it sends them first,
  // so that no newer call overtakes them): it must not be taken for a stale incarnation's.
  class Answering final : public d::Route {
   public:
    explicit Answering(std::weak_ptr<d::ActorCell> cell) : cell_(std::move(cell)) {}
    std::uint64_t incarnation() const override { return 5; }
    bool local() const override { return false; }
    d::Sent send(d::Attempt&& a) override {
      if (auto cell = cell_.lock(); cell && (state_ = cell->take_reply(5, a.seq))) {
        state_->complete_from(troupe::encode_value(int(a.seq) * 10));
      }
      return d::Sent{this, {}, {}};
    }

   private:
    std::weak_ptr<d::ActorCell> cell_;
    std::shared_ptr<d::StateBase> state_;
  };
  Table t(0);
  auto a = t.call(), b = t.call();
  t.cell->bind(std::make_shared<Answering>(t.cell));
  REQUIRE(a.ready());
  CHECK(a.get() == 10);
  CHECK(b.get() == 20);
}

TEST_CASE("call table: an attempt its route could not send is kept, arguments and all, for the next bind") {
  class Ending final : public d::Route {   // a route whose link has just ended
   public:
    std::uint64_t incarnation() const override { return 1; }
    bool local() const override { return false; }
    d::Sent send(d::Attempt&&) override { return d::Sent{nullptr, {}, {}}; }   // args left untouched
  };
  Table t(0);   // no retries: the table keeps no copy of a sent call's arguments of its own
  t.cell->bind(std::make_shared<Ending>());
  auto f = t.call();
  CHECK_FALSE(f.ready());
  t.cell->unbind(1, "its link ended");   // never sent: not a lost attempt, nothing fails
  CHECK_FALSE(f.ready());
  auto next = std::make_shared<FakeRoute>(2);
  t.cell->bind(next);
  REQUIRE(next->seqs == std::vector<std::uint64_t>{1});
  CHECK(next->args[0].bytes == troupe::encode_args(1).bytes);   // the arguments it was made with
  REQUIRE(t.reply(2, 1, 7));
  CHECK(f.get() == 7);
}

TEST_CASE("deadline timer: entries fire at their time, in order, after cancelled ones and before later ones") {
  // The timer's thread sleeps until its earliest entry and is woken only for an earlier one: a
  // deadline added behind a cancelled one, or before the one it sleeps for, must still fire on time.
  d::DeadlineTimer timer;
  std::mutex mu;
  std::vector<std::pair<int, d::Timer::Clock::time_point>> fired;
  auto entry = [&](int id) {
    return [&, id] {
      std::lock_guard lk(mu);
      fired.emplace_back(id, d::Timer::Clock::now());
    };
  };
  const auto t0 = d::Timer::Clock::now();
  const auto cancelled = timer.schedule(t0 + 400ms, entry(0));   // the thread sleeps until this one...
  std::this_thread::sleep_for(20ms);
  timer.cancel(cancelled);                                        // ...which goes
  timer.schedule(t0 + 500ms, entry(1));                           // later than what it sleeps for: no wake-up
  timer.schedule(t0 + 100ms, entry(2));                           // earlier: it must wake for this one
  const auto gone = timer.schedule(t0 + 200ms, entry(3));
  timer.cancel(gone);
  for (int i = 0; i < 300; ++i) {
    {
      std::lock_guard lk(mu);
      if (fired.size() == 2) break;
    }
    std::this_thread::sleep_for(10ms);
  }
  std::this_thread::sleep_for(100ms);   // nothing else fires
  std::lock_guard lk(mu);
  REQUIRE(fired.size() == 2);
  CHECK(fired[0].first == 2);
  CHECK(fired[1].first == 1);
  CHECK(fired[0].second >= t0 + 100ms);
  CHECK(fired[1].second >= t0 + 500ms);
  CHECK(fired[0].second < t0 + 350ms);   // woken for it, not at the cancelled entry's time
}
