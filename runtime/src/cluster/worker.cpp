#include "cluster/worker.hpp"

#include <caf/all.hpp>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdlib>

#include "cluster/peers.hpp"
#include "runtime_impl.hpp"
#include "troupe/net/address.hpp"
#include "troupe/net/hex.hpp"
#include "troupe/net/http.hpp"

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
    auto [host, port] = net::split_address(env_or_die("TROUPE_HEAD"));
    head_host_ = host;
    head_port_ = port;
    token_ = env_or_die("TROUPE_TOKEN");
    bind_ = env_or_die("TROUPE_BIND");
    RuntimeConfig cfg = RuntimeConfig::from_env();
    cfg.address = env_or_die("TROUPE_HEAD");
    cfg.token = token_;
    rt_ = std::make_unique<RuntimeImpl>(cfg);
  }

  [[noreturn]] void run() {
    std::string address;
    try {   // callers link to this address (the head's directory calls it the worker's gateway)
      address = rt_->peers(token_, "worker " + std::to_string(id_)).listen(bind_);
    } catch (const std::exception& e) {
      die(e.what());
    }
    post("/ready", json{{"gateway", address}, {"pid", ::getpid()}});
    spdlog::info("worker {}: links at {}", id_, address);
    auto last_ok = std::chrono::steady_clock::now();
    for (;;) {
      json res;
      try {
        res = post("/poll", json::object());
        last_ok = std::chrono::steady_clock::now();
      } catch (const std::exception& e) {
        if (std::chrono::steady_clock::now() - last_ok > kHeadLostAfter) die(std::string("head unreachable: ") + e.what());
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        continue;
      }
      if (res.value("state", "") == "dead") die("the head retired this worker");
      for (const auto& cmd : res.value("commands", json::array())) {
        if (!run_command(cmd)) finish(0);
      }
    }
  }

 private:
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
    }
    return true;
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
    try {
      post("/events", json{{"events", json::array({json{{"kind", kind}, {"actor_id", id},
                                                        {"incarnation", incarnation}, {"reason", reason}}})}});
    } catch (const std::exception& e) {
      spdlog::error("worker {}: could not report {} of actor {}: {}", id_, kind, id, e.what());
    }
  }

  json post(const std::string& verb, const json& body) {
    auto res = net::http_call(head_host_, head_port_, "POST", "/api/v1/workers/" + std::to_string(id_) + verb,
                                  body.dump(), token_, std::chrono::seconds(10));
    if (res.status != 200) throw std::runtime_error("head answered " + std::to_string(res.status) + ": " + res.body);
    return json::parse(res.body);
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
  std::string head_host_;
  std::uint16_t head_port_ = 0;
  std::string token_, bind_;
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
