// The in-process actor core: ordering, concurrency, errors as values, kill, timeouts, shutdown.
#include <doctest/doctest.h>

#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>
#include <thread>

#include "support/gate_actor.hpp"
#include "troupe/proc_file.hpp"
#include "test_actors.hpp"

TROUPE_ACTOR(Counter, add, get, log_calls, sleep_ms, fail);
TROUPE_ACTOR(Broken, ping);
TROUPE_ACTOR(Tracked, ping, sleep_ms);

// Calls another actor from inside a method.
struct Relay {
  int forward(troupe::ActorRef<Counter> c, int k) { return c.call(&Counter::add, k).get(); }
  int refuse(int code) { throw troupe::ErrorException(troupe::Error{troupe::PlacementCode(code), "no room"}); }
  // A nested call that times out: a CallError escapes this method.
  void wait_on(troupe::ActorRef<Counter> c, int ms) { c.with_timeout(std::chrono::milliseconds(1)).call(&Counter::sleep_ms, ms).get(); }
};
TROUPE_ACTOR(Relay, forward, refuse, wait_on);

struct TensorSink {
  std::uintptr_t address(troupe::TensorView t) { return reinterpret_cast<std::uintptr_t>(t.data); }
  float read(troupe::TensorView t, int i) { return t.data_as<float>()[i]; }
  troupe::TensorView scale_first(troupe::TensorView t, float k) { t.data_as<float>()[0] *= k; return t; }
};
TROUPE_ACTOR(TensorSink, address, read, scale_first);

// Tells which thread runs its methods, and whether two of its calls ever overlap.
struct Where {
  std::atomic<bool> busy{false};
  int overlaps = 0;
  std::vector<int> seen;
  std::uint64_t thread() { return std::hash<std::thread::id>{}(std::this_thread::get_id()); }
  std::vector<std::uint64_t> held_on;   // the thread each hold ran on, in order
  int hold(int ms) {   // the number of overlapping calls seen so far
    if (busy.exchange(true)) ++overlaps;
    held_on.push_back(thread());
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    busy = false;
    return overlaps;
  }
  std::vector<std::uint64_t> hold_threads() const { return held_on; }
  std::vector<int> log(int k) { seen.push_back(k); return seen; }
  int fail(std::string why) { throw std::runtime_error(why); }
  // The thread another actor's call_sync ran on, asked from inside this actor's method.
  std::uint64_t nested(troupe::ActorRef<Where> other) { return other.call_sync(&Where::thread); }
};
TROUPE_ACTOR(Where, thread, hold, hold_threads, log, fail, nested);

using namespace std::chrono_literals;
using troupe::ErrorCode;

namespace {
troupe::Runtime make_runtime() { return troupe::Runtime::create(troupe::RuntimeConfig{}).value(); }
}  // namespace

TEST_CASE("a call returns the method's result") {
  auto rt = make_runtime();
  auto c = rt.spawn<Counter>(troupe::Options{}, 10);
  CHECK(c.call(&Counter::add, 5).get() == 15);
  CHECK(c.call(&Counter::get).get() == 15);
}

TEST_CASE("calls to one actor are answered in order") {
  auto rt = make_runtime();
  auto c = rt.spawn<Counter>(troupe::Options{});
  std::vector<troupe::Future<std::vector<int>>> fs;
  for (int i = 0; i < 500; ++i) fs.push_back(c.call(&Counter::log_calls, i));
  auto last = fs.back().get();
  REQUIRE(last.size() == 500);
  for (int i = 0; i < 500; ++i) CHECK(last[i] == i);
  // Each future saw exactly the calls submitted before it.
  for (int i = 0; i < 500; i += 97) CHECK(fs[i].get().size() == std::size_t(i + 1));
}

TEST_CASE("10,000 concurrent calls across 8 actors are all answered") {
  auto rt = make_runtime();
  auto group = rt.spawn_group<Counter>(8, troupe::Options{});
  std::vector<troupe::Future<int>> fs;
  std::vector<std::thread> callers;
  std::mutex mu;
  for (int t = 0; t < 4; ++t) {
    callers.emplace_back([&, t] {
      std::vector<troupe::Future<int>> mine;
      for (int i = 0; i < 2500; ++i) mine.push_back(group[(t * 2500 + i) % 8].call(&Counter::add, 1));
      std::lock_guard lk(mu);
      for (auto& f : mine) fs.push_back(f);
    });
  }
  for (auto& t : callers) t.join();
  REQUIRE(fs.size() == 10000);
  for (auto& f : fs) CHECK(f.wait_for(30s));
  int total = 0;
  for (std::size_t i = 0; i < 8; ++i) total += group[i].call(&Counter::get).get();
  CHECK(total == 10000);
}

TEST_CASE("an exception thrown by a method fails the future with MethodFailed") {
  auto rt = make_runtime();
  auto c = rt.spawn<Counter>(troupe::Options{});
  auto r = c.call(&Counter::fail, std::string("bad input")).result();
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().code == ErrorCode::MethodFailed);
  CHECK(r.error().message.find("bad input") != std::string::npos);
  CHECK_THROWS_AS(c.call(&Counter::fail, std::string("x")).get(), troupe::CallError);
  // The actor survives its method's exception.
  CHECK(c.call(&Counter::add, 1).get() == 1);
}

TEST_CASE("an Error a method throws fails the future with exactly that Error, and a nested call's failure is the method's") {
  auto rt = make_runtime();
  auto relay = rt.spawn<Relay>(troupe::Options{});
  auto r = relay.call(&Relay::refuse, int(troupe::PlacementCode::Infeasible)).result();
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().code == troupe::PlacementCode::Infeasible);
  CHECK(r.error().message == "no room");
  auto slow = rt.spawn<Counter>(troupe::Options{});
  auto nested = relay.call(&Relay::wait_on, slow, 200).result();   // the inner call timed out, not this one
  REQUIRE_FALSE(nested.ok());
  CHECK(nested.error().code == ErrorCode::MethodFailed);
  CHECK(nested.error().message.find("Timeout") != std::string::npos);
  CHECK(relay.call(&Relay::forward, rt.spawn<Counter>(troupe::Options{}), 2).get() == 2);
}

TEST_CASE("tell sends a call whose outcome nobody waits for") {
  auto rt = make_runtime();
  auto c = rt.spawn<Counter>(troupe::Options{});
  for (int i = 0; i < 3; ++i) c.tell(&Counter::add, 2);
  c.tell(&Counter::fail, std::string("logged, not returned"));
  CHECK(c.call(&Counter::get).get() == 6);   // answered in order, after the tells
  rt.kill(c);
  c.tell(&Counter::add, 1);   // to a dead actor: logged, nothing thrown
}

TEST_CASE("arguments that do not decode fail with BadArguments") {
  auto rt = make_runtime();
  auto c = rt.spawn<Counter>(troupe::Options{});
  auto wrong_type = c.call_by_name<int>("add", std::string("not an int")).result();
  REQUIRE_FALSE(wrong_type.ok());
  CHECK(wrong_type.error().code == ErrorCode::BadArguments);
  auto wrong_arity = c.call_by_name<int>("add", 1, 2).result();
  CHECK(wrong_arity.error().code == ErrorCode::BadArguments);
  auto no_method = c.call_by_name<int>("nope", 1).result();
  CHECK(no_method.error().code == ErrorCode::BadArguments);
  troupe::Payload garbage;
  garbage.bytes = {char(0xc1)};   // a byte msgpack never uses
  auto raw = c.call_encoded<int>("add", garbage).result();
  CHECK(raw.error().code == ErrorCode::BadArguments);
  auto truncated = troupe::encode_args(std::string(100, 'x'));
  truncated.bytes.resize(10);
  CHECK(c.call_encoded<int>("fail", truncated).result().error().code == ErrorCode::BadArguments);
  CHECK(c.call(&Counter::add, 2).get() == 2);   // still healthy
}

TEST_CASE("a result of the wrong type fails with BadArguments") {
  auto rt = make_runtime();
  auto c = rt.spawn<Counter>(troupe::Options{});
  auto r = c.call_by_name<std::string>("add", 1).result();
  CHECK(r.error().code == ErrorCode::BadArguments);
}

TEST_CASE("futures of a killed actor fail promptly with ActorDied") {
  auto rt = make_runtime();
  auto c = rt.spawn<Counter>(troupe::Options{});
  auto busy = c.call(&Counter::sleep_ms, 300);
  std::vector<troupe::Future<int>> queued;
  for (int i = 0; i < 100; ++i) queued.push_back(c.call(&Counter::add, 1));
  std::this_thread::sleep_for(20ms);
  auto t0 = std::chrono::steady_clock::now();
  rt.kill(c);
  for (auto& f : queued) {
    REQUIRE(f.wait_for(100ms));   // at once, not after the running call
    CHECK(f.result().error().code == ErrorCode::ActorDied);
  }
  CHECK(busy.wait_for(100ms));
  CHECK(std::chrono::steady_clock::now() - t0 < 200ms);
  auto after = c.call(&Counter::add, 1).result();
  CHECK(after.error().code == ErrorCode::ActorDied);
  CHECK(after.error().message.find("killed") != std::string::npos);
  rt.kill(c);   // idempotent
}

TEST_CASE("a method returning a Future answers when it completes, and its actor serves other calls meanwhile") {
  auto rt = make_runtime();
  auto g = rt.spawn<Gate>(troupe::Options{});
  troupe::Future<int> w = g.call(&Gate::wait);   // the caller's future holds the int, not a Future
  troupe::Future<void> v = g.call(&Gate::wait_void);
  CHECK(g.call(&Gate::waiters).get() == 2);     // answered while both wait
  CHECK_FALSE(w.ready());
  CHECK_FALSE(v.ready());
  CHECK(g.call(&Gate::open, 5).get() == 2);
  CHECK(w.get() == 5);
  CHECK(v.wait_for(5s));
  CHECK(v.result().ok());
  // Completed by another thread than the actor's.
  CHECK(g.call(&Gate::open_later, 9, 20).get() == 9);
  // A failed future fails the call with its Error; a throw before returning one is MethodFailed.
  auto refused = g.call(&Gate::wait);
  CHECK(g.call(&Gate::refuse, std::string("not today")).get() == 1);
  CHECK(refused.result().error().code == ErrorCode::Cancelled);
  CHECK(refused.result().error().message == "not today");
  auto thrown = g.call(&Gate::throw_now, std::string("broken")).result();
  CHECK(thrown.error().code == ErrorCode::MethodFailed);
  CHECK(thrown.error().message.find("broken") != std::string::npos);
  // Killed while a reply is deferred: the caller learns it at once.
  auto orphan = g.call(&Gate::wait);
  CHECK(g.call(&Gate::waiters).get() == 1);
  rt.kill(g);
  REQUIRE(orphan.wait_for(2s));
  CHECK(orphan.result().error().code == ErrorCode::ActorDied);
}

TEST_CASE("a constructor that throws leaves a dead actor whose calls fail") {
  auto rt = make_runtime();
  auto b = rt.spawn<Broken>(troupe::Options{}, std::string("no model file"));
  auto r = b.call(&Broken::ping).result();
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().code == ErrorCode::ActorDied);
  CHECK(r.error().message.find("no model file") != std::string::npos);
}

TEST_CASE("a call past its deadline fails with Timeout and the actor keeps serving") {
  auto rt = make_runtime();
  auto c = rt.spawn<Counter>(troupe::Options{});
  auto slow = c.with_timeout(50ms).call(&Counter::sleep_ms, 400);
  REQUIRE(slow.wait_for(300ms));
  CHECK(slow.result().error().code == ErrorCode::Timeout);
  CHECK(c.call(&Counter::add, 3).get() == 3);   // waits for the sleep, then answers
}

TEST_CASE("Options::call_timeout applies to every call of the actor") {
  auto rt = make_runtime();
  auto c = rt.spawn<Counter>(troupe::Options{}.call_timeout(30ms));
  auto r = c.call(&Counter::sleep_ms, 200).result();
  CHECK(r.error().code == ErrorCode::Timeout);
}

TEST_CASE("scheduled (non-detached) actors answer calls too") {
  auto rt = make_runtime();
  auto group = rt.spawn_group<Counter>(16, troupe::Options{}.detached(false));
  auto all = group.call_all(&Counter::add, 2).get();
  CHECK(all == std::vector<int>(16, 2));
}

namespace {
double process_cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  auto s = [](const timeval& t) { return double(t.tv_sec) + double(t.tv_usec) * 1e-6; };
  return s(u.ru_utime) + s(u.ru_stime);
}
}  // namespace

// A host on its own thread looks for its next call for a moment after each one (it lingers,
// then parks): a run of calls, then none, and the process must go quiet, not spin on.
TEST_CASE("an actor whose calls stopped parks its thread: an idle process uses no CPU") {
  auto rt = make_runtime();
  auto c = rt.spawn<Counter>(troupe::Options{});
  for (int i = 0; i < 2000; ++i) (void)c.call(&Counter::add, 1).get();
  std::vector<troupe::Future<int>> fs;
  for (int i = 0; i < 2000; ++i) fs.push_back(c.call(&Counter::add, 1));
  CHECK(fs.back().get() == 4000);
  std::this_thread::sleep_for(50ms);   // the linger is microseconds; this leaves it far behind
  const double cpu0 = process_cpu_seconds();
  std::this_thread::sleep_for(500ms);
  const double used = process_cpu_seconds() - cpu0;
  CHECK_MESSAGE(used < 0.05, "an idle process used " << used << " s of CPU in 0.5 s");   // a spinning thread: ~0.5
  CHECK(c.call(&Counter::get).get() == 4000);   // and a parked host still answers
}

namespace {
// Context switches of every thread of this process so far: how often its threads woke.
long process_wakeups() {
  long n = 0;
  std::string status;
  for (const auto& t : std::filesystem::directory_iterator("/proc/self/task")) {
    if (troupe::read_proc_file(t.path().string() + "/status", status) != 0) continue;   // a thread that ended
    for (const char* key : {"\nvoluntary_ctxt_switches:", "\nnonvoluntary_ctxt_switches:"}) {
      const auto at = status.find(key);
      if (at != std::string::npos) n += std::strtol(status.c_str() + at + std::strlen(key), nullptr, 10);
    }
  }
  return n;
}
}  // namespace

// CAF's default pool (work stealing) wakes each sleeping thread every relaxed-sleep-duration
// (10 ms) to try a steal: 100 wake-ups a second per pool thread in every idle process, each one
// taking a core from whatever computed there. The runtime's pool shares one queue instead.
TEST_CASE("an idle runtime's threads sleep: no pool thread wakes to poll") {
  troupe::RuntimeConfig config;
  config.threads = 4;   // the pool's size: CAF's default poll would wake these 400 times a second
  auto rt = troupe::Runtime::create(config).value();
  auto c = rt.spawn<Counter>(troupe::Options{});
  auto pooled = rt.spawn<Counter>(troupe::Options{}.detached(false));
  CHECK(c.call(&Counter::add, 1).get() == 1);
  CHECK(pooled.call(&Counter::add, 2).get() == 2);
  std::this_thread::sleep_for(1100ms);   // past the pool's first relaxed wait and the host's linger
  const long before = process_wakeups();
  std::this_thread::sleep_for(1s);
  const long woke = process_wakeups() - before;
  CHECK_MESSAGE(woke < 40, "an idle runtime's threads woke " << woke << " times in 1 s");
  CHECK(pooled.call(&Counter::add, 3).get() == 5);   // and the sleeping pool still runs new work
}

// Work stealing hands each job to the next pool thread in turn and wakes only that one: a call to a
// pooled actor that lands on a thread busy with another actor's long method waits for it (or for
// an idle thread's next steal). With one shared queue the idle thread takes it.
TEST_CASE("a long method on one pool thread does not hold up calls to other pooled actors") {
  troupe::RuntimeConfig config;
  config.threads = 2;
  auto rt = troupe::Runtime::create(config).value();
  auto busy = rt.spawn<Counter>(troupe::Options{}.detached(false));
  auto other = rt.spawn<Counter>(troupe::Options{}.detached(false));
  CHECK(busy.call(&Counter::add, 1).get() == 1);
  auto long_call = busy.call(&Counter::sleep_ms, 2000);   // holds one of the two pool threads
  std::this_thread::sleep_for(100ms);
  for (int i = 1; i <= 6; ++i) CHECK(other.call(&Counter::add, 1).get() == i);   // half would go to the busy thread
  CHECK_FALSE(long_call.wait_for(0ms));   // all answered while the long method still ran
  long_call.get();
}

// Once a method has run long on its host, a caller waiting on its future sleeps until shortly
// before the reply's expected time and then looks for it (StateBase::wait_until): an earlier
// reply still wakes it, a later one is still waited for, a deadline inside the window is kept.
TEST_CASE("waits on a long in-process method: an early reply wakes the waiter, a late one is waited for, a deadline is kept") {
  auto rt = make_runtime();
  auto c = rt.spawn<Counter>(troupe::Options{});
  for (int i = 0; i < 4; ++i) c.call(&Counter::sleep_ms, 200).get();   // its host times it: ~200 ms expected
  const auto early = std::chrono::steady_clock::now();
  c.call(&Counter::sleep_ms, 1).get();   // expected at +200 ms, answered at once
  CHECK(std::chrono::steady_clock::now() - early < 150ms);   // woken by the reply, not by the expected time
  auto late = c.call(&Counter::sleep_ms, 400);   // past the window: the waiter sleeps on until it comes
  CHECK_FALSE(late.wait_for(20ms));   // a deadline before the window is kept
  late.get();
  CHECK(late.ready());
  auto failing = c.call(&Counter::fail, std::string("no"));   // after long runs, an error still reaches the waiter
  CHECK(failing.result().error().code == ErrorCode::MethodFailed);
  CHECK(c.call(&Counter::add, 2).get() == 2);
}

TEST_CASE("shutdown with calls in flight neither hangs nor leaks") {
  Tracked::live = 0;
  std::vector<troupe::Future<int>> fs;
  troupe::Future<void> running;
  {
    auto rt = make_runtime();
    auto group = rt.spawn_group<Tracked>(4, troupe::Options{});
    running = group[0].call(&Tracked::sleep_ms, 100);
    for (int i = 0; i < 1000; ++i) fs.push_back(group[i % 4].call(&Tracked::ping));
    // rt goes out of scope here with calls queued.
  }
  CHECK(Tracked::live == 0);
  for (auto& f : fs) {
    REQUIRE(f.ready());
    auto r = f.result();
    if (r.ok()) CHECK(r.value() == 7); else CHECK(r.error().code == ErrorCode::ActorDied);
  }
  CHECK(running.ready());
}

TEST_CASE("calls after shutdown fail with ActorDied") {
  auto rt = make_runtime();
  auto c = rt.spawn<Counter>(troupe::Options{});
  rt.shutdown();
  CHECK(c.call(&Counter::add, 1).result().error().code == ErrorCode::ActorDied);
  auto late = rt.spawn<Counter>(troupe::Options{});
  CHECK(late.call(&Counter::add, 1).result().error().code == ErrorCode::ActorDied);
}

TEST_CASE("only one runtime may live in a process") {
  auto rt = make_runtime();
  CHECK_THROWS_AS(make_runtime(), std::logic_error);
}

TEST_CASE("an actor reference passed as an argument reaches the same actor") {
  auto rt = make_runtime();
  auto target = rt.spawn<Counter>(troupe::Options{});
  auto relay = rt.spawn<Relay>(troupe::Options{});
  CHECK(relay.call(&Relay::forward, target, 4).get() == 4);
  CHECK(target.call(&Counter::get).get() == 4);
  auto p = troupe::encode_args(target);
  auto [back] = troupe::decode_args<troupe::ActorRef<Counter>>(p);
  CHECK(back == target);
}

TEST_CASE("a reference to an actor of another type does not decode") {
  auto rt = make_runtime();
  auto relay = rt.spawn<Relay>(troupe::Options{});
  auto p = troupe::encode_args(relay);
  CHECK_THROWS_AS(troupe::decode_args<troupe::ActorRef<Counter>>(p), troupe::DecodeError);
}

TEST_CASE("a 64 MiB tensor view passes in-process without a copy") {
  auto rt = make_runtime();
  auto sink = rt.spawn<TensorSink>(troupe::Options{});
  auto t = troupe::TensorView::empty(troupe::DType::F32, {16, 1024, 1024});
  REQUIRE(t.nbytes() == (64u << 20));
  t.data_as<float>()[12345] = 3.5f;
  auto addr = sink.call(&TensorSink::address, t).get();
  CHECK(addr == reinterpret_cast<std::uintptr_t>(t.data));
  auto back = sink.call(&TensorSink::scale_first, t, 2.0f).get();
  CHECK(back.data == t.data);                       // the same bytes came back
  CHECK(t.data_as<float>()[0] == 0.0f);
  CHECK(back.shape == t.shape);
  CHECK(t.data_as<float>()[12345] == 3.5f);
  CHECK(sink.call(&TensorSink::read, t, 12345).get() == 3.5f);
}

namespace {
std::uint64_t this_thread_hash() { return std::hash<std::thread::id>{}(std::this_thread::get_id()); }
}  // namespace

TEST_CASE("call_sync runs an idle in-process actor's method on the calling thread, and otherwise takes the actor's way") {
  auto rt = make_runtime();
  auto w = rt.spawn<Where>(troupe::Options{});
  REQUIRE(w.ready().wait_for(5s));
  const auto own = w.call(&Where::thread).get();   // the actor's thread
  CHECK(own != this_thread_hash());
  CHECK(w.call_sync(&Where::thread) == this_thread_hash());
  CHECK(w.with_timeout(5s).call_sync(&Where::thread) == own);   // a deadline needs the actor's thread
  // Behind a call in flight it waits its turn: nothing overtakes.
  auto first = w.call(&Where::log, 1);
  auto second = w.call_sync(&Where::log, 2);
  CHECK(second == std::vector<int>{1, 2});
  CHECK(first.get() == std::vector<int>{1});
  CHECK(w.call_sync(&Where::log, 3) == std::vector<int>{1, 2, 3});
  // Errors as call().get() gives them.
  try {
    (void)w.call_sync(&Where::fail, std::string("bad input"));
    FAIL("call_sync did not throw");
  } catch (const troupe::CallError& e) {
    CHECK(e.error().code == ErrorCode::MethodFailed);
    CHECK(e.error().message.find("bad input") != std::string::npos);
  }
  // From inside another actor's method: on that actor's thread.
  auto outer = rt.spawn<Where>(troupe::Options{});
  const auto outer_thread = outer.call(&Where::thread).get();
  CHECK(outer.call(&Where::nested, w).get() == outer_thread);
  // An actor of a scheduled (non-detached) host too.
  auto pooled = rt.spawn<Where>(troupe::Options{}.detached(false));
  REQUIRE(pooled.ready().wait_for(5s));
  CHECK(pooled.call_sync(&Where::thread) == this_thread_hash());
}

TEST_CASE("a call running on its caller's thread holds the actor: other calls wait for it, and a kill fails it when it returns") {
  auto rt = make_runtime();
  auto w = rt.spawn<Where>(troupe::Options{});
  REQUIRE(w.ready().wait_for(5s));
  const auto own = w.call(&Where::thread).get();
  int held_overlaps = -1;
  std::uint64_t caller_thread = 0;
  std::thread caller([&] {
    caller_thread = this_thread_hash();
    held_overlaps = w.call_sync(&Where::hold, 200);
  });
  std::this_thread::sleep_for(50ms);
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(w.call(&Where::hold, 0).get() == 0);   // ran after the held call, not beside it
  CHECK(std::chrono::steady_clock::now() - t0 >= 100ms);
  caller.join();
  CHECK(held_overlaps == 0);
  CHECK(w.call(&Where::hold_threads).get() == std::vector<std::uint64_t>{caller_thread, own});

  // A kill while it runs: the call fails with ActorDied once its method returns, and the object
  // is destroyed after that, not under it.
  Tracked::live = 0;
  auto t = rt.spawn<Tracked>(troupe::Options{});
  REQUIRE(t.ready().wait_for(5s));
  REQUIRE(Tracked::live == 1);
  std::optional<troupe::Error> error;
  const auto start = std::chrono::steady_clock::now();
  std::chrono::steady_clock::duration failed_after{};
  std::thread sleeper([&] {
    try {
      t.call_sync(&Tracked::sleep_ms, 200);
    } catch (const troupe::CallError& e) {
      error = e.error();
    }
    failed_after = std::chrono::steady_clock::now() - start;
  });
  std::this_thread::sleep_for(50ms);
  rt.kill(t);
  std::this_thread::sleep_for(50ms);
  CHECK(Tracked::live == 1);   // its method still runs
  sleeper.join();
  REQUIRE(error.has_value());
  CHECK(error->code == ErrorCode::ActorDied);
  CHECK(failed_after >= 190ms);   // when its method returned, on this thread (the actor's way: at the kill)
  for (int i = 0; i < 200 && Tracked::live != 0; ++i) std::this_thread::sleep_for(10ms);
  CHECK(Tracked::live == 0);
  CHECK(t.call(&Tracked::ping).result().error().code == ErrorCode::ActorDied);
}
