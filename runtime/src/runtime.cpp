#include "runtime_impl.hpp"

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include <stdexcept>
#include <thread>

#include "actor_host.hpp"

namespace troupe {
namespace detail {
namespace {

std::atomic<RuntimeImpl*> g_current{nullptr};   // the process's live runtime (at most one)

}  // namespace

RuntimeImpl::RuntimeImpl(RuntimeConfig config) : config_(std::move(config)) {
  RuntimeImpl* expected = nullptr;
  if (!g_current.compare_exchange_strong(expected, this)) {
    throw std::logic_error("a troupe::Runtime is already running in this process");
  }
  system_ = std::make_unique<caf::actor_system>(configure(caf_config_, config_));
}

RuntimeImpl::~RuntimeImpl() {
  shutdown();
  RuntimeImpl* self = this;
  g_current.compare_exchange_strong(self, nullptr);
}

caf::actor_system_config& RuntimeImpl::configure(caf::actor_system_config& cfg, const RuntimeConfig& rc) {
  unsigned threads = rc.threads > 0 ? unsigned(rc.threads) : std::max(1u, std::thread::hardware_concurrency());
  cfg.set("scheduler.max-threads", threads);
  return cfg;
}

std::shared_ptr<ActorCell> RuntimeImpl::spawn(const ActorTypeInfo& type, Factory factory, Payload ctor_args,
                                              const Options& opts) {
  std::uint64_t id = next_id_.fetch_add(1);
  std::string label = (opts.name().empty() ? type.name : opts.name()) + "#" + std::to_string(id);
  auto timeout = opts.call_timeout().count() > 0 ? opts.call_timeout() : config_.call_timeout;
  auto cell = std::make_shared<ActorCell>(id, type.name, std::move(label), &timer_, timeout);
  {
    std::lock_guard lk(mu_);
    if (shut_down_) {
      cell->mark_dead("was not started: the runtime has shut down");
      return cell;
    }
    cells_.emplace(id, cell);
  }
  cell->set_handle(spawn_host(*system_, opts.detached(), cell, type, factory, std::move(ctor_args)));
  spdlog::debug("spawned {}", cell->label());
  return cell;
}

void RuntimeImpl::kill(const std::shared_ptr<ActorCell>& cell) {
  {
    std::lock_guard lk(mu_);
    cells_.erase(cell->id());
  }
  if (caf::actor handle = cell->mark_dead("was killed")) {
    caf::anon_send_exit(handle, caf::exit_reason::kill);
    spdlog::debug("killed {}", cell->label());
  }
}

std::shared_ptr<ActorCell> RuntimeImpl::find(std::uint64_t id) const {
  std::lock_guard lk(mu_);
  auto it = cells_.find(id);
  return it == cells_.end() ? nullptr : it->second;
}

void RuntimeImpl::shutdown() {
  std::unordered_map<std::uint64_t, std::shared_ptr<ActorCell>> cells;
  {
    std::lock_guard lk(mu_);
    if (shut_down_) return;
    shut_down_ = true;
    cells.swap(cells_);
  }
  for (auto& [id, cell] : cells) {
    if (caf::actor handle = cell->mark_dead("stopped: the runtime shut down")) {
      caf::anon_send_exit(handle, caf::exit_reason::kill);
    }
  }
  timer_.stop();
  system_.reset();   // joins every actor and scheduler thread; running calls finish first
}

// --- free functions behind the public templates ----------------------------------------------------
std::shared_ptr<ActorCell> spawn_actor(RuntimeImpl& rt, const ActorTypeInfo& type, Factory factory,
                                       Payload ctor_args, const Options& opts) {
  return rt.spawn(type, factory, std::move(ctor_args), opts);
}

void kill_actor(RuntimeImpl& rt, const std::shared_ptr<ActorCell>& cell) { rt.kill(cell); }

std::shared_ptr<ActorCell> find_cell(std::uint64_t id) {
  RuntimeImpl* rt = g_current.load();
  return rt == nullptr ? nullptr : rt->find(id);
}

}  // namespace detail

// --- Runtime ---------------------------------------------------------------------------------------
Runtime::Runtime(std::unique_ptr<detail::RuntimeImpl> impl) : impl_(std::move(impl)) {}
Runtime::Runtime(Runtime&&) noexcept = default;
Runtime& Runtime::operator=(Runtime&&) noexcept = default;
Runtime::~Runtime() = default;

Runtime Runtime::create(RuntimeConfig config) {
  auto level = spdlog::level::from_str(config.log_level);
  spdlog::set_level(level);
  return Runtime(std::make_unique<detail::RuntimeImpl>(std::move(config)));
}

void Runtime::shutdown() {
  if (impl_) impl_->shutdown();
}

const RuntimeConfig& Runtime::config() const { return impl_->config(); }

}  // namespace troupe
