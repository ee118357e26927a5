#include <atomic>
#include <random>
#include <thread>

#include "placement_test_util.hpp"
#include "troupe/placement/dispatcher.hpp"

using namespace troupe::placement;

TEST_CASE("the dispatcher sends each item to the member with the least outstanding cost") {
  std::mt19937_64 rng(3);
  LeastLoadedDispatcher d(5);
  std::vector<std::int64_t> model_cost(5, 0), model_items(5, 0);
  std::vector<LeastLoadedDispatcher::Ticket> open;
  for (int step = 0; step < 5000; ++step) {
    if (!open.empty() && rng() % 3 == 0) {
      const std::size_t i = rng() % open.size();
      d.release(open[i]);
      model_cost[open[i].member] -= open[i].cost;
      --model_items[open[i].member];
      open.erase(open.begin() + static_cast<std::ptrdiff_t>(i));
      continue;
    }
    const std::int64_t cost = static_cast<std::int64_t>(rng() % 100);
    std::size_t expect = 0;  // brute force: least (cost, items, index)
    for (std::size_t m = 1; m < 5; ++m)
      if (std::tie(model_cost[m], model_items[m]) < std::tie(model_cost[expect], model_items[expect])) expect = m;
    auto t = d.acquire(cost);
    REQUIRE(t.has_value());
    CHECK(t->member == expect);
    model_cost[t->member] += cost;
    ++model_items[t->member];
    open.push_back(*t);
  }
  for (std::size_t m = 0; m < 5; ++m) CHECK(d.outstanding_cost(m) == model_cost[m]);
}

TEST_CASE("zero-cost items rotate across members instead of piling on the first") {
  LeastLoadedDispatcher d(3);
  CHECK(d.acquire(0)->member == 0);
  CHECK(d.acquire(0)->member == 1);
  CHECK(d.acquire(0)->member == 2);
}

TEST_CASE("removed members get no new work and added members do") {
  LeastLoadedDispatcher d(2);
  auto t = d.acquire(10);
  d.remove_member(0);
  for (int i = 0; i < 3; ++i) CHECK(d.acquire(1)->member == 1);
  d.release(*t);  // a removed member's ticket is still accepted
  CHECK(d.outstanding_cost(0) == 0);
  const std::size_t fresh = d.add_member();
  CHECK(fresh == 2);
  CHECK(d.acquire(1)->member == fresh);
  d.remove_member(1);
  d.remove_member(2);
  CHECK_FALSE(d.acquire(1).has_value());
}

TEST_CASE("the dispatcher is thread-safe: concurrent acquire and release balance to zero") {
  LeastLoadedDispatcher d(8);
  std::atomic<bool> negative{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(static_cast<std::uint64_t>(t));
      for (int i = 0; i < 20'000; ++i) {
        auto ticket = d.acquire(static_cast<std::int64_t>(rng() % 1000));
        if (!ticket || d.outstanding_cost(ticket->member) < 0) negative = true;
        d.release(*ticket);
      }
    });
  for (auto& th : threads) th.join();
  CHECK_FALSE(negative.load());
  for (std::size_t m = 0; m < 8; ++m) {
    CHECK(d.outstanding_cost(m) == 0);
    CHECK(d.outstanding_items(m) == 0);
  }
}
