#include "raw_caf.hpp"

#include <caf/all.hpp>

#include <thread>
#include <vector>

#include "bench_util.hpp"

namespace bench {
namespace {

caf::behavior echo(caf::event_based_actor*) {
  return {[](int x) { return x; }};
}

void sync_calls(caf::scoped_actor& self, const caf::actor& a, int n) {
  for (int i = 0; i < n; ++i) self->request(a, caf::infinite, i).receive([](int) {}, [](caf::error&) {});
}

// Issues all requests, then collects every response.
void async_calls(caf::scoped_actor& self, const std::vector<caf::actor>& as, int n) {
  std::vector<caf::response_handle<caf::blocking_actor, caf::message, true>> hs;
  hs.reserve(n);
  for (int i = 0; i < n; ++i) hs.push_back(self->request(as[i % as.size()], caf::infinite, i));
  for (auto& h : hs) h.receive([](int) {}, [](caf::error&) {});
}

}  // namespace

std::map<std::string, double> run_raw_caf(double seconds) {
  caf::actor_system_config cfg;
  cfg.set("scheduler.max-threads", std::max(1u, std::thread::hardware_concurrency()));
  caf::actor_system sys{cfg};
  std::map<std::string, double> out;
  std::vector<caf::actor> members;
  for (int i = 0; i < kMembers; ++i) members.push_back(sys.spawn<caf::detached>(echo));
  {
    caf::scoped_actor self{sys};
    out["raw_caf_1_1_actor_calls_sync"] = rate(seconds, 200, [&] { sync_calls(self, members[0], 200); });
    out["raw_caf_1_1_actor_calls_async"] = rate(seconds, kBatch, [&] { async_calls(self, {members[0]}, kBatch); });
    out["raw_caf_1_n_actor_calls_async"] = rate(seconds, kBatch, [&] { async_calls(self, members, kBatch); });
  }
  out["raw_caf_n_n_actor_calls_async"] = rate(seconds, long(kCallers) * kBatch, [&] {
    std::vector<std::thread> ts;
    for (int c = 0; c < kCallers; ++c) ts.emplace_back([&] { caf::scoped_actor self{sys}; async_calls(self, members, kBatch); });
    for (auto& t : ts) t.join();
  });
  for (auto& m : members) caf::anon_send_exit(m, caf::exit_reason::kill);
  out["raw_caf_actor_creation_per_s"] = rate(seconds, 100, [&] {
    caf::scoped_actor self{sys};
    std::vector<caf::actor> as;
    for (int i = 0; i < 100; ++i) as.push_back(sys.spawn<caf::detached>(echo));
    for (auto& a : as) self->request(a, caf::infinite, 1).receive([](int) {}, [](caf::error&) {});
    for (auto& a : as) caf::anon_send_exit(a, caf::exit_reason::kill);
  });
  return out;
}

}  // namespace bench
