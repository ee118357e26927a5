#include "runtime_impl.hpp"

#include <caf/all.hpp>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <filesystem>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "cluster/peers.hpp"
#include "cluster/wire.hpp"
#include "troupe/embedded_cluster.hpp"
#include "troupe/ids.hpp"
#include "troupe/net/address.hpp"
#include "troupe/net/session.hpp"

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
  // CAF's pool runs the small actors (Options::detached(false)) with one shared queue (work
  // sharing): an idle pool thread sleeps on its condition variable until a job comes, and each job
  // wakes one. CAF's default, work stealing, gives each job to the next thread in turn, wakes that
  // thread only, and has idle threads poll every relaxed-sleep-duration (10 ms) to steal: 100
  // wake-ups a second per pool thread in every process, busy or idle, each taking its core from
  // whatever computed there (CAF 0.17 names these threads "caf.multiplexer"), and a job handed to
  // a thread busy with a long method waits for it or for the next steal. CAF is this process's
  // actor system only: no middleman, no port (other processes are reached by links, Peers).
  cfg.set("scheduler.policy", caf::atom("sharing"));
  return cfg;
}

std::shared_ptr<ActorCell> RuntimeImpl::spawn(const ActorTypeInfo& type, const std::string& signature,
                                              Factory factory, Payload ctor_args, const Options& opts) {
  if (opts.needs_process()) {
    try {
      {
        std::lock_guard lk(mu_);
        if (shut_down_) throw CallError(Error{ErrorCode::Unavailable, "the runtime has shut down"});
      }
      return cluster().spawn(type, signature, ctor_args, opts);
    } catch (const CallError& e) {   // refused, or no head: a ref whose ready() and calls fail with it
      auto cell = std::make_shared<ActorCell>(
          CellSpec{0, type.name, actor_label(opts.name().empty() ? type.name : opts.name(), 0), config_.call_timeout},
          CallTableEnv{&timer_, &release_regions});
      cell->mark_failed(e.error());
      return cell;
    }
  }
  return spawn_local(next_id_.fetch_add(1), type, factory, std::move(ctor_args), opts, HostContext{});
}

std::shared_ptr<ActorCell> RuntimeImpl::spawn_hosted(std::uint64_t id, const ActorTypeInfo& type, Factory factory,
                                                     Payload ctor_args, const Options& opts, HostContext ctx) {
  return spawn_local(id, type, factory, std::move(ctor_args), opts, std::move(ctx));
}

std::shared_ptr<LocalRoute> RuntimeImpl::host_of(const ActorCell& cell) {
  return std::dynamic_pointer_cast<LocalRoute>(cell.route());
}

std::shared_ptr<ActorCell> RuntimeImpl::spawn_local(std::uint64_t id, const ActorTypeInfo& type, Factory factory,
                                                    Payload ctor_args, const Options& opts, HostContext ctx) {
  std::string label = actor_label(opts.name().empty() ? type.name : opts.name(), id);
  auto timeout = opts.call_timeout().count() > 0 ? opts.call_timeout() : config_.call_timeout;
  auto cell = std::make_shared<ActorCell>(CellSpec{id, type.name, std::move(label), timeout},
                                          CallTableEnv{&timer_, &release_regions});
  {
    std::lock_guard lk(mu_);
    if (shut_down_) {
      cell->mark_dead("was not started: the runtime has shut down");
      return cell;
    }
    cells_[id] = cell;
  }
  cell->bind(spawn_host(*system_, opts.detached(), cell, type, factory, std::move(ctor_args), std::move(ctx)));
  spdlog::debug("spawned {}", cell->label());
  return cell;
}

void RuntimeImpl::kill(const std::shared_ptr<ActorCell>& cell) {
  forget(cell->id());
  if (cell->remote()) {
    if (client_) client_->kill(cell); else cell->mark_dead("was killed");
    return;
  }
  if (cell->mark_dead("was killed")) spdlog::debug("killed {}", cell->label());
  std::uint64_t exported = 0;
  {
    std::lock_guard lk(mu_);
    if (auto it = exported_.find(cell->id()); it != exported_.end()) {
      exported = it->second;
      cells_.erase(exported);
    }
  }
  if (exported != 0 && client_) {   // other processes learn it from the head's directory
    if (auto* p = peers_if_any()) p->unhost(exported);
    try {
      client_->request("POST", "/api/v1/actors/" + std::to_string(exported) + "/kill", nlohmann::json{{"reason", "was killed"}});
    } catch (const CallError& e) {
      spdlog::warn("kill {}: the head was not told: {}", cell->label(), e.what());
    }
  }
}

std::shared_ptr<ActorCell> RuntimeImpl::find(std::uint64_t id) const {
  std::lock_guard lk(mu_);
  auto it = cells_.find(id);
  return it == cells_.end() ? nullptr : it->second;
}

std::shared_ptr<ActorCell> RuntimeImpl::resolve(std::uint64_t id, const std::string& type) {
  if (auto cell = find(id)) return cell;
  if (id < kClusterActorBase) return nullptr;
  {
    std::lock_guard lk(cluster_mu_);
    if (!client_ && config_.address.empty()) return nullptr;   // no cluster: no such actor
  }
  return cluster().attach(id, type);
}

void RuntimeImpl::add_cell(const std::shared_ptr<ActorCell>& cell) {
  std::lock_guard lk(mu_);
  if (!shut_down_) cells_[cell->id()] = cell;
}

void RuntimeImpl::forget(std::uint64_t id) {
  std::lock_guard lk(mu_);
  cells_.erase(id);
}

std::uint64_t RuntimeImpl::export_cell(const std::shared_ptr<ActorCell>& cell) {
  std::lock_guard ex(export_mu_);
  {
    std::lock_guard lk(mu_);
    if (auto it = exported_.find(cell->id()); it != exported_.end()) return it->second;
  }
  auto refuse = [&](Code code, const std::string& why) {
    return ErrorException(Error{code, cell->label() + " cannot be passed to another process: " + why});
  };
  if (cell->dead()) throw refuse(ErrorCode::ActorDied, "it is dead");
  std::shared_ptr<LocalRoute> host = host_of(*cell);
  if (!host) throw refuse(ErrorCode::BadArguments, "it has no host here");
  try {
    auto& client = cluster();
    auto& links = peers(client.head().token, "driver");
    std::string gateway = links.address();   // a worker's; a driver listens from its first export on
    if (gateway.empty()) gateway = links.listen(client.advertise_host());
    const std::string& label = cell->label();
    const std::uint64_t id = client.host_actor(cell->type(), label.substr(0, label.rfind('#')), gateway);
    cell->serve_remote({client.head().token, 1});   // the head records incarnation 1: it never restarts
    links.host(id, 1, host);
    {
      std::lock_guard lk(mu_);
      exported_[cell->id()] = id;
      cells_[id] = cell;   // its cluster id, coming back in a message, finds it here
    }
    spdlog::debug("{} is callable from other processes as actor {} at {}", label, id, gateway);
    return id;
  } catch (const ErrorException& e) {   // no cluster, the head refused, or no port to listen on
    throw refuse(e.error().code, e.error().message);
  }
}

RuntimeImpl* RuntimeImpl::current() { return g_current.load(); }

cluster::Peers* RuntimeImpl::peers_if_any() {
  std::lock_guard lk(peers_mu_);
  return peers_.get();
}

cluster::Peers& RuntimeImpl::peers(const std::string& token, const std::string& role) {
  std::lock_guard lk(peers_mu_);
  if (!peers_) peers_ = std::make_unique<cluster::Peers>(*this, token, role);
  return *peers_;
}

cluster::ClusterClient& RuntimeImpl::cluster() {
  std::lock_guard lk(cluster_mu_);
  if (client_) return *client_;
  cluster::HeadEndpoint head;
  if (!config_.address.empty()) {
    auto [host, port] = net::split_address(config_.address);
    head = {host, port, config_.token.empty() ? net::latest_session_token(config_.session_root) : config_.token};
    if (head.token.empty()) {
      throw CallError(Error{ErrorCode::Unavailable, "no cluster token: pass --troupe-token-file or set TROUPE_TOKEN"});
    }
  } else {   // an embedded head and node, so a single program needs no daemon
    EmbeddedClusterFactory make = embedded_cluster_factory();
    if (make == nullptr) {
      throw CallError(Error{ErrorCode::Unavailable,
                            "no --address and no embedded cluster in this program: link it with troupe::troupe"});
    }
    try {
      embedded_ = make(EmbeddedClusterSpec{config_.session_root});
    } catch (const std::exception& e) {
      throw CallError(Error{ErrorCode::Unavailable, std::string("cannot start the embedded cluster: ") + e.what()});
    }
    head = {embedded_->host(), embedded_->port(), embedded_->token()};
  }
  client_ = std::make_unique<cluster::ClusterClient>(*this, peers(head.token, "driver"), head, &timer_,
                                                    config_.remote_call_timeout);
  return *client_;
}

void RuntimeImpl::shutdown() {
  std::unordered_map<std::uint64_t, std::shared_ptr<ActorCell>> cells;
  {
    std::lock_guard lk(mu_);
    if (shut_down_) return;
    shut_down_ = true;
    cells.swap(cells_);
  }
  {
    std::lock_guard lk(cluster_mu_);
    if (client_) client_->stop(/*keep_actors=*/false);   // a driver's actors end with it
    if (embedded_) embedded_->stop();   // terminates its worker processes
  }
  for (auto& [id, cell] : cells) cell->mark_dead("stopped: the runtime shut down");
  timer_.stop();
  client_.reset();
  {
    std::lock_guard lk(peers_mu_);
    if (peers_) peers_->stop();   // closes every link; no reply completes a cell after this
  }
  system_.reset();   // joins every actor and scheduler thread; running calls finish first
  embedded_.reset();
}

// --- free functions behind the public templates ----------------------------------------------------
std::shared_ptr<ActorCell> spawn_actor(RuntimeImpl& rt, const ActorTypeInfo& type, const std::string& signature,
                                       Factory factory, Payload ctor_args, const Options& opts) {
  return rt.spawn(type, signature, factory, std::move(ctor_args), opts);
}

void kill_actor(RuntimeImpl& rt, const std::shared_ptr<ActorCell>& cell) { rt.kill(cell); }

std::shared_ptr<ActorCell> resolve_cell(std::uint64_t id, const std::string& type) {
  RuntimeImpl* rt = g_current.load();
  return rt == nullptr ? nullptr : rt->resolve(id, type);
}

bool cell_remote(const ActorCell& cell) { return cell.remote(); }

namespace {
thread_local bool t_crossing = false;   // RemoteArgs: what is encoded now goes to another process
}  // namespace

RemoteArgs::RemoteArgs(bool crossing) : previous_(t_crossing) { t_crossing = crossing; }
RemoteArgs::~RemoteArgs() { t_crossing = previous_; }

std::uint64_t ref_wire_id(const std::shared_ptr<ActorCell>& cell) {
  if (!t_crossing || cell->remote() || cell->id() >= kClusterActorBase || cell->id() == 0) return cell->id();
  RuntimeImpl* rt = g_current.load();
  if (rt == nullptr) throw ErrorException(Error{ErrorCode::Unavailable, cell->label() + ": no runtime in this process"});
  return rt->export_cell(cell);
}

}  // namespace detail

// --- Runtime ---------------------------------------------------------------------------------------
Runtime::Runtime(std::unique_ptr<detail::RuntimeImpl> impl) : impl_(std::move(impl)) {}
Runtime::Runtime(Runtime&&) noexcept = default;
Runtime& Runtime::operator=(Runtime&&) noexcept = default;
Runtime::~Runtime() = default;

namespace {

// stdout belongs to the program: troupe's log lines go to stderr (a worker's and a daemon's both
// land in the session's log files). A default logger the program installed itself is kept.
void log_to_stderr() {
  static std::once_flag once;
  std::call_once(once, [] {
    auto current = spdlog::default_logger();
    if (current != nullptr && !current->name().empty()) return;
    auto logger = std::make_shared<spdlog::logger>("troupe", std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
    if (current != nullptr) logger->set_level(current->level());
    spdlog::set_default_logger(std::move(logger));
  });
}

}  // namespace

Result<Runtime> Runtime::create(RuntimeConfig config) {
  log_to_stderr();
  auto level = spdlog::level::from_str(config.log_level);
  spdlog::set_level(level);
  const bool joins = !config.address.empty();
  Runtime rt(std::make_unique<detail::RuntimeImpl>(std::move(config)));
  if (joins) {   // the head checks the token now: a refusal is this call's, not a spawn's
    if (auto st = rt.connect(); !st.ok()) {
      rt.shutdown();
      return st.error();
    }
  }
  return Result<Runtime>(std::move(rt));
}

PlacementGroup Runtime::placement_group(const std::vector<std::string>& bundles, const std::string& strategy,
                                        const std::string& name, bool lifetime_detached) {
  try {
    auto& cluster = impl_->cluster();
    nlohmann::json body{{"bundles", bundles}, {"strategy", strategy}, {"name", name},
                        {"owner", lifetime_detached ? 0 : cluster.owner()}};
    auto res = cluster.request("POST", "/api/v1/placement_groups", body);
    const auto id = res.at("id").get<std::uint64_t>();
    cluster.seed_group(id, res.value("state", ""));
    return PlacementGroup(impl_.get(), id);
  } catch (const CallError& e) {   // refused, or no head: the group's futures carry it
    return PlacementGroup(impl_.get(), 0, std::make_shared<const Error>(e.error()));
  }
}

std::string PlacementGroup::state() const {
  if (refused_) return "REFUSED";
  try {
    return rt_->cluster().request("GET", "/api/v1/placement_groups/" + std::to_string(id_), nullptr).value("state", "");
  } catch (const CallError& e) {
    if (e.code() == ErrorCode::BadArguments) return "REMOVED";
    throw;
  }
}

Future<void> PlacementGroup::ready_future() const {
  if (refused_) return make_error_future<void>(*refused_);
  try {
    return rt_->cluster().group_ready(id_);
  } catch (const CallError& e) {
    return make_error_future<void>(e.error());
  }
}

bool PlacementGroup::ready(std::chrono::milliseconds timeout) const {
  auto f = ready_future();
  return f.wait_for(timeout) && f.result().ok();
}

void PlacementGroup::remove() const {
  if (refused_) return;
  try {
    auto res = rt_->cluster().request("POST", "/api/v1/placement_groups/" + std::to_string(id_) + "/remove",
                                      nlohmann::json::object());
    rt_->cluster().group_removed(id_);
    for (const auto& id : res.value("killed_actors", nlohmann::json::array())) {   // fail their calls now
      if (auto cell = rt_->find(id.get<std::uint64_t>())) {
        cell->mark_dead("was killed: its placement group was removed");
        rt_->forget(cell->id());
      }
    }
  } catch (const CallError& e) {
    if (e.code() != ErrorCode::BadArguments) throw;
    rt_->cluster().group_removed(id_);   // already removed
  }
}

Status Runtime::connect() {
  try {
    (void)impl_->cluster();
  } catch (const CallError& e) {
    return e.error();
  }
  return {};
}

void Runtime::shutdown() {
  if (impl_) impl_->shutdown();
}

const RuntimeConfig& Runtime::config() const { return impl_->config(); }

}  // namespace troupe
