#include "cluster/worker.hpp"

#include <caf/all.hpp>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <mutex>

#include "actor_host.hpp"
#include "cluster/client.hpp"
#include "cluster/peers.hpp"
#include "runtime_impl.hpp"
#include "troupe/net/hex.hpp"

namespace troupe::detail {
namespace {

using json = nlohmann::json;

constexpr auto kHeadLostAfter = std::chrono::seconds(10);

std::string env_or_die(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') {
    std::fprintf(stderr, "troupe worker: %s is not set (workers are started by a node daemon)\n", name);
    std::exit(2);
  }
  return v;
}

class Worker {
 public:
  explicit Worker(std::uint64_t id) : id_(id) {
    token_ = env_or_die("TROUPE_TOKEN");
    bind_ = env_or_die("TROUPE_BIND");
    RuntimeConfig cfg = RuntimeConfig::from_env();
    cfg.address = env_or_die("TROUPE_HEAD");
    cfg.token = token_;
    rt_ = std::make_unique<RuntimeImpl>(cfg);
  }

  [[noreturn]] void run() {
    std::string address;
    cluster::ClusterClient* client = nullptr;
    try {   // callers link to this address (the head's directory calls it the worker's gateway)
      address = rt_->peers(token_, "worker " + std::to_string(id_)).listen(bind_);
      client = &rt_->cluster();   // this process's link to the head
    } catch (const std::exception& e) {
      die(e.what());
    }
    client->serve_as_worker(id_, address, [this](const json& order) {
      std::lock_guard lk(mu_);
      orders_.push_back(order);
      cv_.notify_one();
    });
    json welcome = next_order(kHeadLostAfter);
    if (welcome.is_null()) die("the head sent no welcome in time");
    if (welcome.contains("error")) die("the head refused this worker: " + welcome.value("error", std::string()));
    spdlog::info("worker {}: links at {}", id_, address);
    for (;;) {   // every order is pushed: nothing here wakes but an order
      json order = next_order(std::chrono::hours(1));
      if (order.is_null()) continue;
      if (order.value("kind", "") == "head_lost") die("the head retired this worker, or is gone: " + order.value("why", ""));
      if (!run_command(order)) finish(0);
    }
  }

 private:
  // The next order from the head, or null after `timeout`.
  json next_order(std::chrono::milliseconds timeout) {
    std::unique_lock lk(mu_);
    if (!cv_.wait_for(lk, timeout, [&] { return !orders_.empty(); })) return nullptr;
    json o = std::move(orders_.front());
    orders_.pop_front();
    return o;
  }

  // False when the worker should exit.
  bool run_command(const json& cmd) {
    std::string kind = cmd.value("kind", "");
    if (kind == "exit") return false;
    if (kind == "kill") {
      auto id = cmd.at("actor_id").get<std::uint64_t>();
      rt_->peers(token_).unhost(id);
      if (auto cell = rt_->find(id)) rt_->kill(cell);
    } else if (kind == "spawn") {
      spawn(cmd);
    } else if (kind == "drain") {
      drain(cmd.at("actor_id").get<std::uint64_t>(), cmd.value("incarnation", std::uint64_t{0}));
    }
    return true;
  }

  // Reports the actor drained once the calls queued to it so far have run (a barrier call behind
  // them in its mailbox); a call that fails (the actor died meanwhile) reports nothing.
  void drain(std::uint64_t id, std::uint64_t incarnation) {
    auto cell = rt_->find(id);
    if (!cell) return;
    auto barrier = std::make_shared<State<void>>();
    StateBase* raw = barrier.get();   // alive while its callback runs
    barrier->on_ready([this, raw, id, incarnation] {
      if (!raw->has_error()) report(id, incarnation, "actor_drained", "");
    });
    cell->submit(kBarrierMethod, Payload{}, std::move(barrier), std::chrono::nanoseconds(0));
  }

  void spawn(const json& cmd) {
    auto id = cmd.at("actor_id").get<std::uint64_t>();
    auto incarnation = cmd.at("incarnation").get<std::uint64_t>();
    std::string type_name = cmd.at("type").get<std::string>();
    const ActorTypeInfo* type = Registry::instance().find(type_name);
    Factory factory = type ? type->find_factory(cmd.at("ctor_signature").get<std::string>()) : nullptr;
    if (factory == nullptr) {
      report(id, incarnation, "actor_failed", "this binary has no constructor for " + type_name + " with these arguments");
      return;
    }
    Payload args;
    try {
      args.bytes = net::from_hex(cmd.at("ctor_args").get<std::string>());
    } catch (const std::invalid_argument& e) {
      report(id, incarnation, "actor_failed", std::string("constructor arguments: ") + e.what());
      return;
    }
    Options opts;
    opts.name(cmd.value("name", ""));
    HostContext ctx{incarnation, token_};
    auto cell = rt_->spawn_hosted(id, *type, factory, std::move(args), opts, ctx);
    rt_->peers(token_).host(id, incarnation, RuntimeImpl::host_of(*cell));
    cell->ready().state()->on_ready([this, id, incarnation, cell] {
      auto s = cell->ready().state();
      if (s->has_error()) report(id, incarnation, "actor_failed", s->error().message);
      else report(id, incarnation, "actor_ready", "");
    });
  }

  void report(std::uint64_t id, std::uint64_t incarnation, const std::string& kind, const std::string& reason) {
    json event{{"kind", kind}, {"actor_id", id}, {"incarnation", incarnation}, {"reason", reason}};
    if (!rt_->cluster().send_events(json::array({event}))) {
      spdlog::error("worker {}: could not report {} of actor {}: the link to the head has ended", id_, kind, id);
    }
  }

  [[noreturn]] void die(const std::string& why) {
    spdlog::error("worker {}: {}", id_, why);
    finish(1);
  }

  [[noreturn]] void finish(int status) {
    rt_->shutdown();
    rt_.reset();
    std::fflush(nullptr);
    std::_Exit(status);   // no static destructors: other threads of user code may still run
  }

  std::uint64_t id_;
  std::string token_, bind_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<json> orders_;   // pushed by the head, taken by run()
  std::unique_ptr<RuntimeImpl> rt_;
};

}  // namespace

void run_worker(const char* worker_id) {
  std::uint64_t id = 0;
  try {
    id = std::stoull(worker_id);
  } catch (const std::exception&) {
    std::fprintf(stderr, "troupe worker: bad worker id '%s'\n", worker_id);
    std::exit(2);
  }
  spdlog::set_pattern("[%Y-%m-%d %H:%M:%S.%e] [worker " + std::to_string(id) + "] [%l] %v");
  spdlog::set_level(spdlog::level::info);
  try {
    Worker(id).run();
  } catch (const std::exception& e) {
    spdlog::error("worker {}: {}", id, e.what());
    std::fflush(nullptr);
    std::_Exit(1);
  }
}

}  // namespace troupe::detail
