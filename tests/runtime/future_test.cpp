// Futures and promises: completion once, then(), wait_all / wait_any, when_all.
#include <doctest/doctest.h>

#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "troupe/future.hpp"

using namespace std::chrono_literals;

TEST_CASE("a future completes exactly once") {
  troupe::Promise<int> p;
  auto f = p.future();
  CHECK_FALSE(f.ready());
  CHECK(p.set_value(1));
  CHECK_FALSE(p.set_value(2));
  CHECK_FALSE(p.set_error(troupe::Error{troupe::ErrorCode::Internal, "late"}));
  CHECK(f.get() == 1);
}

TEST_CASE("get() throws CallError carrying the error code") {
  auto f = troupe::make_error_future<int>(troupe::Error{troupe::ErrorCode::Timeout, "slow"});
  try {
    (void)f.get();
    FAIL("get() returned");
  } catch (const troupe::CallError& e) {
    CHECK(e.code() == troupe::ErrorCode::Timeout);
    CHECK(std::string(e.what()) == "Timeout: slow");
  }
}

TEST_CASE("then() chains values and skips on error") {
  troupe::Promise<int> p;
  auto doubled = p.future().then([](int v) { return v * 2; });
  auto text = doubled.then([](int v) { return std::to_string(v); });
  p.set_value(21);
  CHECK(text.get() == "42");
  auto failed = troupe::make_error_future<int>(troupe::Error{troupe::ErrorCode::ActorDied, "x"});
  bool ran = false;
  auto skipped = failed.then([&](int) { ran = true; return 0; });
  CHECK(skipped.result().error().code == troupe::ErrorCode::ActorDied);
  CHECK_FALSE(ran);
  auto threw = troupe::make_ready_future(1).then([](int) -> int { throw std::runtime_error("boom"); });
  CHECK(threw.result().error().code == troupe::ErrorCode::MethodFailed);
  auto v = troupe::make_ready_future().then([] { return 5; });
  CHECK(v.get() == 5);
}

TEST_CASE("a future that never completes is freed with the then() and when_all() callbacks it holds") {
  std::weak_ptr<troupe::detail::State<int>> source;
  std::weak_ptr<troupe::detail::State<std::vector<int>>> joined;
  {
    troupe::Promise<int> p;   // never completed: its producer went away
    source = p.state();
    auto chained = p.future().then([](int v) { return v + 1; });
    auto all = troupe::when_all(std::vector<troupe::Future<int>>{p.future(), troupe::make_ready_future(1)});
    joined = all.state();
  }
  CHECK(source.expired());   // its own callbacks held it before: a cycle, never freed
  CHECK(joined.expired());
}

TEST_CASE("a source freed by one of its own callbacks as it completes fails what was chained to it") {
  auto p = std::make_unique<troupe::Promise<int>>();
  troupe::Future<int> chained;
  troupe::Future<std::vector<int>> all;
  {
    auto f = p->future();
    f.state()->on_ready([&p] { p.reset(); });   // drops the state's last holder mid-completion
    chained = f.then([](int v) { return v; });
    all = troupe::when_all(std::vector<troupe::Future<int>>{f});
  }
  p->set_value(1);
  CHECK(chained.result().error().code == troupe::ErrorCode::Internal);   // not lost, not a crash
  CHECK(all.result().error().code == troupe::ErrorCode::Internal);
}

TEST_CASE("when_all() keeps each input's value once it completed, though nobody else holds it") {
  troupe::Promise<int> last;
  auto all = [&] {
    troupe::Promise<int> first;
    auto f = troupe::when_all(std::vector<troupe::Future<int>>{first.future(), last.future()});
    first.set_value(1);
    return f;   // `first` and its future are gone now
  }();
  CHECK_FALSE(all.ready());
  last.set_value(2);
  CHECK(all.get() == std::vector<int>{1, 2});
}

TEST_CASE("wait_for() times out on a pending future and succeeds on a completed one") {
  troupe::Promise<void> p;
  auto f = p.future();
  CHECK_FALSE(f.wait_for(10ms));
  std::thread t([&] { std::this_thread::sleep_for(20ms); p.set_value(); });
  CHECK(f.wait_for(5s));
  t.join();
}

TEST_CASE("wait_any() returns the index of the first completed future") {
  std::vector<troupe::Promise<int>> ps(4);
  std::vector<troupe::Future<int>> fs;
  for (auto& p : ps) fs.push_back(p.future());
  std::thread t([&] { std::this_thread::sleep_for(10ms); ps[2].set_value(7); });
  CHECK(troupe::wait_any(fs) == 2);
  t.join();
  for (auto& p : ps) p.set_value(0);
  troupe::wait_all(fs);
  troupe::wait_all(fs[0], fs[1]);
  for (auto& f : fs) CHECK(f.ready());
}

TEST_CASE("when_all() gathers values in order or reports the first error") {
  std::vector<troupe::Future<int>> fs;
  for (int i = 0; i < 5; ++i) fs.push_back(troupe::make_ready_future(i));
  CHECK(troupe::when_all(fs).get() == std::vector<int>{0, 1, 2, 3, 4});
  fs[3] = troupe::make_error_future<int>(troupe::Error{troupe::ErrorCode::Timeout, "t"});
  CHECK(troupe::when_all(fs).result().error().code == troupe::ErrorCode::Timeout);
  CHECK(troupe::when_all(std::vector<troupe::Future<int>>{}).get().empty());
  std::vector<troupe::Future<void>> vs{troupe::make_ready_future(), troupe::make_ready_future()};
  CHECK(troupe::when_all(vs).result().ok());
}
