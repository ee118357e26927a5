// ActorGroup: call_all, scatter and member access.
#include <doctest/doctest.h>

#include <chrono>
#include <thread>

#include "troupe/troupe.hpp"

namespace {
struct Shard {
  int rank = -1;
  int set_rank(int r) { return rank = r; }
  int sum(std::vector<int> xs) {
    int s = 0;
    for (int x : xs) s += x;
    return s + 1000 * rank;
  }
  void noop() {}
  int slow_rank(int ms) {
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    return rank;
  }
};
}  // namespace
TROUPE_ACTOR(Shard, set_rank, sum, noop, slow_rank);

TEST_CASE("call_all answers with one result per member, in member order") {
  auto rt = troupe::Runtime::create().value();
  auto g = rt.spawn_group<Shard>(4, troupe::Options{});
  REQUIRE(g.size() == 4);
  std::vector<troupe::Future<int>> fs;
  for (std::size_t i = 0; i < g.size(); ++i) fs.push_back(g[i].call(&Shard::set_rank, int(i)));
  troupe::wait_all(fs);
  auto sums = g.call_all(&Shard::sum, std::vector<int>{1, 2}).get();
  CHECK(sums == std::vector<int>{3, 1003, 2003, 3003});
  CHECK(g.call_all(&Shard::noop).result().ok());
}

TEST_CASE("scatter sends shard i to member i") {
  auto rt = troupe::Runtime::create().value();
  auto g = rt.spawn_group<Shard>(3, troupe::Options{});
  auto sums = g.scatter(&Shard::sum, std::vector<std::vector<int>>{{1}, {2, 2}, {3, 3, 3}}).get();
  CHECK(sums == std::vector<int>{-999, -996, -991});
  auto bad = g.scatter(&Shard::sum, std::vector<std::vector<int>>{{1}});
  CHECK(bad.result().error().code == troupe::ErrorCode::BadArguments);
}

TEST_CASE("a group call fails when one member is dead") {
  auto rt = troupe::Runtime::create().value();
  auto g = rt.spawn_group<Shard>(3, troupe::Options{});
  rt.kill(g[1]);
  auto r = g.call_all(&Shard::set_rank, 1).result();
  CHECK(r.error().code == troupe::ErrorCode::ActorDied);
}

TEST_CASE("call_balanced sends work to the member with the least outstanding cost") {
  auto rt = troupe::Runtime::create().value();
  auto g = rt.spawn_group<Shard>(2, troupe::Options{});
  g[0].call(&Shard::set_rank, 0).get();
  g[1].call(&Shard::set_rank, 1).get();
  auto big = g.call_balanced(1000, &Shard::slow_rank, 300);   // member 0 now carries 1000
  std::vector<troupe::Future<int>> small;
  for (int i = 0; i < 5; ++i) small.push_back(g.call_balanced(10, &Shard::slow_rank, 0));
  for (auto& f : small) CHECK(f.get() == 1);   // 5 x 10 < 1000: all to the idle member
  CHECK(big.get() == 0);
  // Once the big call completed its cost is returned: zero-cost calls rotate again.
  for (int i = 0; i < 1000 && g.outstanding_cost(0) != 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  REQUIRE(g.outstanding_cost(0) == 0);
  auto a = g.call_balanced(0, &Shard::slow_rank, 50);   // in flight together: they spread
  auto b = g.call_balanced(0, &Shard::slow_rank, 50);
  CHECK(a.get() != b.get());
  troupe::ActorGroup<Shard> empty;
  CHECK(empty.call_balanced(1, &Shard::noop).result().error().code == troupe::ErrorCode::Unavailable);
}
