#include "cluster/client.hpp"

#include <spdlog/spdlog.h>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <algorithm>
#include <filesystem>

#include "cluster/peers.hpp"
#include "cluster/remote_route.hpp"
#include "runtime_impl.hpp"
#include "troupe/ids.hpp"
#include "troupe/net/hex.hpp"
#include "troupe/net/http.hpp"

namespace troupe::cluster {
namespace {

using json = nlohmann::json;
// How long calls on a link that ended with its peer perhaps alive (an EOF from another host, or a
// process that closed it) wait for the head to say the worker died, before being treated as calls
// to a live worker. Generous: failing a dead worker's call with Unavailable instead of ActorDied
// misleads. (A peer on this host whose pid ended, or one that fell silent, is dead at once.)
constexpr auto kLinkGrace = std::chrono::seconds(10);

std::uint64_t env_number(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == 0) return 0;
  try {
    return std::stoull(v);
  } catch (const std::exception&) {
    throw CallError(Error{ErrorCode::BadArguments, std::string(name) + " is not a number: " + v});
  }
}

// The job this process belongs to (TROUPE_JOB_ID, set by the node daemon that started it), 0: none.
std::uint64_t own_job() { return env_number("TROUPE_JOB_ID"); }

// The binary worker processes run: this one. In a job whose package holds it, named relative to
// the job's directory, so each node runs its own copy of the package (never this node's path).
std::string self_binary() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return std::string();
  if (const char* dir = std::getenv("TROUPE_JOB_DIR"); dir != nullptr && own_job() != 0) {
    const auto root = std::filesystem::weakly_canonical(dir, ec);
    const auto rel = p.lexically_relative(root);
    if (!ec && !rel.empty() && *rel.begin() != "..") return rel.string();
  }
  return p.string();
}

// The hello of a driver: a job's current attempt says which (TROUPE_JOB_ATTEMPT is the driver's
// alone; the job's worker processes carry TROUPE_JOB_ID only).
json driver_hello() {
  json hello{{"role", "driver"}, {"pid", ::getpid()}};
  if (const auto attempt = env_number("TROUPE_JOB_ATTEMPT"); attempt != 0 && own_job() != 0) {
    hello["job"] = own_job();
    hello["attempt"] = attempt;
  }
  return hello;
}

}  // namespace

ClusterClient::ClusterClient(detail::RuntimeImpl& rt, Peers& peers, HeadEndpoint head, detail::Timer* timer,
                             std::chrono::milliseconds call_timeout)
    : rt_(rt), peers_(peers), head_(std::move(head)), timer_(timer), call_timeout_(call_timeout) {
  const auto link = call_head("GET", "/api/v1/link", nullptr).value("link", "");
  try {
    session_ = std::make_unique<net::HeadSession>(peers_.hub(), link, driver_hello(), std::chrono::seconds(10));
  } catch (const ErrorException& e) {   // NetCode: Unreachable, Refused
    throw CallError(Error{ErrorCode::Unavailable, "the head's link at " + link + ": " + e.error().message});
  }
  owner_ = session_->welcome().value("owner", std::uint64_t{0});
  relinks_->wake = session_->waker();
  peers_.on_loss([this](const net::Link& link, net::LinkEnd end, const std::string& why) { on_link_lost(link, end, why); });
  watcher_ = std::thread([this] { watch_loop(); });
}

ClusterClient::~ClusterClient() { stop(true); }

json ClusterClient::call_head(const std::string& method, const std::string& target, const json& body) {
  net::HttpResponse res;
  try {
    res = net::http_call(head_.host, head_.port, method, target, body.is_null() ? "" : body.dump(), head_.token,
                    std::chrono::seconds(10));
  } catch (const ErrorException& e) {   // NetCode::Unreachable
    throw CallError(Error{ErrorCode::Unavailable, "head: " + e.error().message});
  }
  json parsed = json::parse(res.body, nullptr, false);
  if (res.status != 200) {
    std::string why = parsed.is_object() ? parsed.value("error", res.body) : res.body;
    ErrorCode code = res.status == 400 || res.status == 404 || res.status == 409 ? ErrorCode::BadArguments
                                                                                : ErrorCode::Unavailable;
    throw CallError(Error{code, "head refused: " + why});
  }
  if (parsed.is_discarded()) throw CallError(Error{ErrorCode::Unavailable, "head sent a body that is not JSON"});
  return parsed;
}

std::shared_ptr<detail::ActorCell> ClusterClient::make_cell(std::uint64_t id, const std::string& type,
                                                            const std::string& name, int max_retries,
                                                            std::chrono::milliseconds timeout) {
  auto cell = std::make_shared<detail::ActorCell>(
      detail::CellSpec{id, type, actor_label(name.empty() ? type : name, id),
                       timeout.count() > 0 ? timeout : call_timeout_, max_retries, /*remote=*/true},
      detail::CallTableEnv{timer_, &detail::release_regions});
  json seen;
  {
    std::lock_guard lk(mu_);
    cells_[id] = cell;
    if (auto it = latest_.find(id); it != latest_.end()) seen = it->second;
  }
  rt_.add_cell(cell);
  if (!seen.is_null()) apply(seen);   // the head's word came before the cell
  return cell;
}

std::shared_ptr<detail::ActorCell> ClusterClient::spawn(const detail::ActorTypeInfo& type, const std::string& signature,
                                                        const Payload& ctor_args, const Options& opts) {
  if (!ctor_args.tensors.empty()) {
    throw CallError(Error{ErrorCode::BadArguments, "tensors cannot be constructor arguments of a worker actor"});
  }
  json req{{"type", type.name}, {"name", opts.name()}, {"ctor_signature", signature},
           {"ctor_args", net::to_hex(ctor_args.bytes)}, {"max_restarts", opts.max_restarts()},
           {"max_retries", opts.max_retries()}, {"resources", opts.resource_text()}, {"binary", self_binary()},
           {"colocate_with", opts.colocate_with()}, {"placement_group", opts.placement_group()},
           {"bundle_index", opts.bundle_index()}, {"colocate", opts.colocate()},
           {"owner", opts.lifetime_detached() ? 0 : owner_}, {"job", own_job()}};
  auto res = call_head("POST", "/api/v1/actors", req);
  auto id = res.at("actor_id").get<std::uint64_t>();
  auto cell = make_cell(id, type.name, opts.name(), opts.max_retries(), opts.call_timeout());
  {
    std::lock_guard lk(mu_);
    owned_.insert(id);
  }
  return cell;
}

std::uint64_t ClusterClient::create_elastic(const detail::ActorTypeInfo& type, const std::string& signature,
                                            const Payload& ctor_args, const Options& opts, const std::string& name,
                                            int min, int max) {
  if (!ctor_args.tensors.empty()) {
    throw CallError(Error{ErrorCode::BadArguments, "tensors cannot be constructor arguments of a worker actor"});
  }
  json member{{"type", type.name}, {"name", opts.name().empty() ? name : opts.name()}, {"ctor_signature", signature},
              {"ctor_args", net::to_hex(ctor_args.bytes)}, {"max_restarts", opts.max_restarts()},
              {"max_retries", opts.max_retries()}, {"resources", opts.resource_text()}, {"binary", self_binary()},
              {"owner", opts.lifetime_detached() ? 0 : owner_}, {"job", own_job()}};
  auto res = call_head("POST", "/api/v1/elastic_groups", json{{"name", name}, {"min", min}, {"max", max}, {"member", member}});
  return res.at("id").get<std::uint64_t>();
}

std::vector<std::shared_ptr<detail::ActorCell>> ClusterClient::elastic_members(std::uint64_t group, const std::string& type,
                                                                               const Options& opts) {
  std::vector<std::pair<std::uint64_t, std::string>> alive;
  std::vector<std::shared_ptr<detail::ActorCell>> out;
  {
    std::lock_guard lk(mu_);
    for (const auto& [id, a] : latest_) {
      if (a.value("elastic_group", std::uint64_t{0}) != group || a.value("state", "") != "alive" ||
          a.value("leaving", false)) {
        continue;   // a member on a draining node takes no new calls
      }
      auto it = cells_.find(id);
      auto cell = it != cells_.end() ? it->second.lock() : nullptr;
      if (cell && !cell->dead()) out.push_back(std::move(cell));
      else alive.emplace_back(id, a.value("name", ""));
    }
  }
  for (const auto& [id, name] : alive) {   // first sight: a cell bound from the pushed entry
    out.push_back(make_cell(id, type, name, opts.max_retries(), opts.call_timeout()));
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a->id() < b->id(); });
  return out;
}

bool ClusterClient::wait_elastic(std::uint64_t group, std::size_t min, std::chrono::steady_clock::time_point deadline,
                                 std::string* why) {
  std::unique_lock lk(mu_);
  auto count = [&] {
    std::size_t n = 0;
    for (const auto& [id, a] : latest_) {
      n += a.value("elastic_group", std::uint64_t{0}) == group && a.value("state", "") == "alive" && !a.value("leaving", false) ? 1 : 0;
    }
    return n;
  };
  if (directory_cv_.wait_until(lk, deadline, [&] { return stopping_ || count() >= min; }) && !stopping_) return true;
  lk.unlock();
  if (why != nullptr) {
    try {
      *why = call_head("GET", "/api/v1/elastic_groups/" + std::to_string(group), nullptr).value("reason", "");
    } catch (const CallError& e) {
      *why = e.error().message;
    }
  }
  return false;
}

std::shared_ptr<detail::ActorCell> ClusterClient::attach(std::uint64_t id, const std::string& type) {
  json a;
  try {
    a = call_head("GET", "/api/v1/actors/" + std::to_string(id), nullptr);
  } catch (const CallError&) {
    return nullptr;
  }
  if (a.value("type", "") != type) return nullptr;
  auto cell = make_cell(id, type, a.value("name", ""), 0, std::chrono::milliseconds(0));
  apply(a);
  return cell;
}

std::uint64_t ClusterClient::host_actor(const std::string& type, const std::string& name, const std::string& gateway) {
  auto res = call_head("POST", "/api/v1/actors/hosted",
                       json{{"type", type}, {"name", name}, {"gateway", gateway}, {"owner", owner_}, {"pid", ::getpid()}});
  const auto id = res.at("actor_id").get<std::uint64_t>();
  std::lock_guard lk(mu_);
  owned_.insert(id);   // killed at the head when this client stops
  return id;
}

std::string ClusterClient::advertise_host() const {
  if (head_.host == "127.0.0.1" || head_.host == "localhost" || head_.host == "::1") return "127.0.0.1";
  // The local end of a route to the head (a UDP connect sends nothing): the interface that reaches it.
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(head_.host.c_str(), std::to_string(head_.port).c_str(), &hints, &found) != 0 || found == nullptr) {
    return "0.0.0.0";
  }
  std::string out = "0.0.0.0";
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd >= 0 && ::connect(fd, found->ai_addr, found->ai_addrlen) == 0) {
    sockaddr_in local{};
    socklen_t len = sizeof local;
    char text[INET_ADDRSTRLEN] = {};
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0 &&
        ::inet_ntop(AF_INET, &local.sin_addr, text, sizeof text) != nullptr) {
      out = text;
    }
  }
  if (fd >= 0) ::close(fd);
  ::freeaddrinfo(found);
  return out;
}

void ClusterClient::kill(const std::shared_ptr<detail::ActorCell>& cell) {
  try {
    call_head("POST", "/api/v1/actors/" + std::to_string(cell->id()) + "/kill", json::object());
  } catch (const CallError& e) {
    spdlog::warn("kill {}: {}", cell->label(), e.what());
  }
  cell->mark_dead("was killed");
  std::lock_guard lk(mu_);
  owned_.erase(cell->id());
}

void ClusterClient::stop(bool keep_actors) {
  if (stopping_.exchange(true)) return;
  {
    std::lock_guard lk(mu_);   // waiters on the directory wake and see stopping_
  }
  directory_cv_.notify_all();
  if (!keep_actors) {
    std::set<std::uint64_t> owned;
    { std::lock_guard lk(mu_); owned.swap(owned_); }
    for (auto id : owned) {
      try {
        call_head("POST", "/api/v1/actors/" + std::to_string(id) + "/kill", json{{"reason", "its driver exited"}});
      } catch (const CallError&) {   // the head is gone: its nodes stop the workers themselves
      }
    }
  }
  if (session_) session_->close();
  if (watcher_.joinable()) watcher_.join();
  peers_.on_loss(nullptr);   // the links stay the runtime's (Peers): it closes them when it stops
}

void ClusterClient::serve_as_worker(std::uint64_t id, const std::string& address, OrderHandler on_order) {
  {
    std::lock_guard lk(order_mu_);
    on_order_ = std::move(on_order);
  }
  session_->send(net::head_kind::kHello, json{{"role", "worker"}, {"worker_id", id}, {"gateway", address},
                                              {"pid", ::getpid()}});
}

bool ClusterClient::send_events(const json& events) {
  return session_->send(net::head_kind::kEvents, json{{"events", events}});
}

// Waits for what the head pushes: no timer, no poll (stop() closes the link, which ends the wait).
void ClusterClient::watch_loop() {
  for (;;) {
    bool retry = false;
    {
      std::scoped_lock lk(mu_, relinks_->mu);
      for (auto id : relinks_->ids) unlinked_.insert(id);   // their links ended: linked again below
      relinks_->ids.clear();
      retry = !unlinked_.empty();
    }
    // Back-off after a failure: an actor whose worker could not be linked is tried again soon.
    auto msg = session_->next(retry ? std::chrono::milliseconds(200) : std::chrono::hours(1));
    if (!msg) {   // a back-off's end, or woken for actors to link again
      std::vector<json> again;
      {
        std::scoped_lock lk(mu_, relinks_->mu);
        for (auto id : relinks_->ids) unlinked_.insert(id);
        relinks_->ids.clear();
        for (auto id : unlinked_) {
          if (auto it = latest_.find(id); it != latest_.end()) again.push_back(it->second);
        }
        unlinked_.clear();
      }
      for (const auto& a : again) apply(a);
      continue;
    }
    if (msg->kind == net::head_kind::kDirectory) {
      for (const auto& a : msg->body.value("actors", json::array())) {
        if (a.is_object() && a.contains("id")) apply(a);
      }
      for (const auto& g : msg->body.value("groups", json::array())) {
        if (g.is_object() && g.contains("id")) apply_group(g.at("id").get<std::uint64_t>(), g.value("state", ""), false);
      }
      continue;
    }
    json order = msg->kind == 0 ? json{{"kind", "head_lost"}, {"why", msg->body.value("why", std::string())}} : msg->body;
    if (msg->kind == 0 && !stopping_) {
      spdlog::warn("the link to the head ended: {}", order.value("why", ""));
      on_head_lost(order.value("why", ""));
    }
    {
      std::lock_guard lk(order_mu_);
      if (on_order_) on_order_(order);
    }
    if (msg->kind == 0) return;
  }
}

Future<void> ClusterClient::group_ready(std::uint64_t id) {
  {
    std::lock_guard lk(mu_);
    if (auto it = groups_.find(id); it != groups_.end() && !it->second.state.empty()) {
      if (it->second.state == "CREATED") return make_ready_future();
      if (it->second.state == "REMOVED") {
        return make_error_future<void>(Error{PlacementCode::NotFound, "placement group " + std::to_string(id) + " was removed"});
      }
      if (!head_gone_.empty()) {   // no head to create it (on_head_lost)
        return make_error_future<void>(Error{ErrorCode::Unavailable, "placement group " + std::to_string(id) + " cannot be created: " + head_gone_});
      }
      Promise<void> p;
      it->second.waiting.push_back(p);
      return p.future();
    }
  }
  // Not created here: the head's word seeds it.
  try {
    seed_group(id, call_head("GET", "/api/v1/placement_groups/" + std::to_string(id), nullptr).value("state", ""));
  } catch (const CallError& e) {
    if (e.code() != ErrorCode::BadArguments) return make_error_future<void>(e.error());
    return make_error_future<void>(Error{PlacementCode::NotFound, "placement group " + std::to_string(id) + " was removed"});
  }
  return group_ready(id);
}

void ClusterClient::group_removed(std::uint64_t id) { apply_group(id, "REMOVED", false); }

void ClusterClient::seed_group(std::uint64_t id, const std::string& state) {
  apply_group(id, state.empty() ? "PENDING" : state, /*seed=*/true);
}

void ClusterClient::apply_group(std::uint64_t id, const std::string& state, bool seed) {
  std::vector<Promise<void>> done;
  {
    std::lock_guard lk(mu_);
    auto& g = groups_[id];
    if (seed && !g.state.empty()) return;   // a push came first: it is newer
    if (g.state == "REMOVED") return;       // for good (ids are not reused): a late push changes nothing
    g.state = state;
    if (state == "CREATED" || state == "REMOVED") done.swap(g.waiting);
  }
  for (auto& p : done) {
    if (state == "CREATED") p.set_value();
    else p.set_error(Error{PlacementCode::NotFound, "placement group " + std::to_string(id) + " was removed"});
  }
}

void ClusterClient::apply(const json& a) {
  auto id = a.at("id").get<std::uint64_t>();
  std::shared_ptr<detail::ActorCell> cell;
  {
    std::lock_guard lk(mu_);
    auto& latest = latest_[id];
    const auto incarnation = a.value("incarnation", std::uint64_t{0});
    if (latest.is_object() && latest.value("incarnation", std::uint64_t{0}) > incarnation) return;   // stale
    latest = a;
    if (auto it = cells_.find(id); it != cells_.end()) cell = it->second.lock();
  }
  if (a.value("elastic_group", std::uint64_t{0}) != 0) directory_cv_.notify_all();
  if (!cell || cell->dead()) return;
  std::string state = a.value("state", "");
  auto incarnation = a.value("incarnation", std::uint64_t{0});
  auto route = cell->route();
  const auto* bound = dynamic_cast<const LinkRoute*>(route.get());
  if (state == "dead") {
    std::string reason = a.value("reason", "");
    cell->mark_dead(reason.empty() ? "died" : reason);
    rt_.forget(id);
    return;
  }
  if (bound && bound->incarnation() < incarnation) {
    cell->unbind(bound->incarnation(), "was restarted: " + a.value("reason", std::string("its process died")));
  }
  if (state != "alive" || (bound && bound->incarnation() == incarnation)) return;
  std::string address = a.value("gateway", "");   // the worker's link address
  if (address.empty()) return;
  auto link = peers_.link_to(address);
  if (!link) {   // unreachable now: the watcher tries again after a back-off
    std::lock_guard lk(mu_);
    unlinked_.insert(id);
    return;
  }
  {
    std::lock_guard lk(mu_);
    unlinked_.erase(id);
  }
  cell->bind(std::make_shared<LinkRoute>(id, incarnation, std::move(link)));
  cell->set_ready();
}

void ClusterClient::on_head_lost(const std::string& why) {
  std::vector<std::shared_ptr<detail::ActorCell>> stranded;
  std::vector<std::pair<std::uint64_t, Promise<void>>> groups;
  std::string gone;
  {
    std::lock_guard lk(mu_);
    head_gone_ = "the link to the head ended" + (why.empty() ? std::string() : " (" + why + ")");
    gone = head_gone_;
    for (auto& [id, weak] : cells_) {   // unbound, or bound to a link that ended (on_link_lost may not have run)
      auto cell = weak.lock();
      if (!cell || cell->dead()) continue;
      const auto route = cell->route();
      const auto* on = dynamic_cast<const LinkRoute*>(route.get());
      if (!route || (on != nullptr && on->link()->closed())) stranded.push_back(std::move(cell));
    }
    unlinked_.clear();
    for (auto& [id, g] : groups_) {
      for (auto& p : g.waiting) groups.emplace_back(id, std::move(p));
      g.waiting.clear();
    }
  }
  for (auto& cell : stranded) {
    cell->mark_failed(Error{ErrorCode::Unavailable, cell->label() + " cannot be placed, restarted or linked: " + gone});
  }
  for (auto& [id, p] : groups) {
    p.set_error(Error{ErrorCode::Unavailable, "placement group " + std::to_string(id) + " cannot be created: " + gone});
  }
}

void ClusterClient::on_link_lost(const net::Link& link, net::LinkEnd end, const std::string& why) {
  if (end == net::LinkEnd::Closed) return;   // closed here: stopping, or a spare
  std::vector<std::pair<std::shared_ptr<detail::ActorCell>, std::uint64_t>> lost;
  std::vector<std::pair<std::uint64_t, std::weak_ptr<detail::ActorCell>>> bound;
  std::string head_gone;
  {
    std::lock_guard lk(mu_);
    if (stopping_) return;
    head_gone = head_gone_;
    for (auto& [id, weak] : cells_) {
      auto cell = weak.lock();
      if (!cell) continue;
      auto route = cell->route();
      const auto* on = dynamic_cast<const LinkRoute*>(route.get());
      if (on == nullptr || on->link() != &link) continue;
      lost.push_back({cell, on->incarnation()});
      bound.emplace_back(id, cell);
    }
  }
  if (!head_gone.empty()) {   // no head to restart them or to say where they run: gone for this process
    for (auto& [cell, incarnation] : lost) {
      if (end == net::LinkEnd::Exited) cell->mark_dead("lost its worker process (" + why + "); no restart: " + head_gone);
      else cell->mark_failed(Error{ErrorCode::Unavailable, cell->label() + " lost its worker's link (" + why + "); not linked again: " + head_gone});
    }
    return;
  }
  if (end == net::LinkEnd::Exited || end == net::LinkEnd::Frozen) {   // dead: ActorDied, or retried at the restart
    for (auto& [cell, incarnation] : lost) cell->unbind(incarnation, "lost its worker process: " + why);
    return;
  }
  // Lost: perhaps only the connection (the peer's end, or a fault found here: a send that timed
  // out, a refused message). Calls wait for the head's word (a restart or death unbinds them,
  // ActorDied); still waiting after the grace, they had a live worker: resent on a new link when
  // max_retries allows, else Unavailable, and the watcher links the actor again from its directory
  // entry (later calls wait in its table until then).
  spdlog::info("link to the worker at {} ended ({}); waiting for the head's word", link.address(), why);
  // Held, so that no new link can take its address meanwhile.
  std::shared_ptr<const net::Link> gone = link.shared_from_this();
  timer_->schedule(detail::Timer::Clock::now() + kLinkGrace, [bound = std::move(bound), gone, relinks = std::weak_ptr<Relinks>(relinks_)] {
    std::vector<std::uint64_t> broken;
    for (const auto& [id, weak] : bound) {
      auto cell = weak.lock();
      if (!cell) continue;
      auto route = cell->route();
      if (const auto* on = dynamic_cast<const LinkRoute*>(route.get()); on != nullptr && on->link() == gone.get()) {
        cell->route_broken(on, "lost its connection");
        broken.push_back(id);
      }
    }
    auto r = relinks.lock();
    if (!r || broken.empty()) return;
    std::function<void()> wake;
    {
      std::lock_guard lk(r->mu);
      r->ids.insert(broken.begin(), broken.end());
      wake = r->wake;
    }
    if (wake) wake();
  });
}

}  // namespace troupe::cluster
