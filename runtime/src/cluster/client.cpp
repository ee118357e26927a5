#include "cluster/client.hpp"

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <spdlog/spdlog.h>

#include <filesystem>

#include "troupe/net/hex.hpp"
#include "troupe/net/http.hpp"
#include "cluster/remote_route.hpp"
#include "runtime_impl.hpp"
#include "troupe/net/address.hpp"

namespace troupe::cluster {
namespace {

using json = nlohmann::json;
using monitor_atom = caf::atom_constant<caf::atom("tr_mon")>;
// How long calls of a broken call channel wait for the worker's death notice (the gateway's
// monitor, or the head's directory: seconds under load) before being treated as calls to a live
// worker. Generous: failing a dead worker's call with Unavailable instead of ActorDied misleads.
constexpr auto kChannelGrace = std::chrono::seconds(10);

caf::behavior router(caf::event_based_actor* self, ClusterClient* client, detail::RuntimeImpl* rt) {
  self->set_down_handler([client](caf::down_msg& dm) { client->on_gateway_down(dm.source); });
  return {
      [rt](const detail::WireReply& r) {
        if (auto cell = rt->find(r.actor_id)) deliver_reply(*cell, r);
      },
      [self](monitor_atom, const caf::actor& gateway) { self->monitor(gateway); },
  };
}

std::string self_binary() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : p.string();
}

}  // namespace

ClusterClient::ClusterClient(detail::RuntimeImpl& rt, caf::actor_system& sys, HeadEndpoint head,
                             detail::Timer* timer, std::chrono::milliseconds call_timeout)
    : rt_(rt), sys_(sys), head_(std::move(head)), timer_(timer), call_timeout_(call_timeout) {
  router_ = sys_.spawn(router, this, &rt_);
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
      detail::CellSpec{id, type, (name.empty() ? type : name) + "#" + std::to_string(id),
                       timeout.count() > 0 ? timeout : call_timeout_, max_retries, /*remote=*/true},
      detail::CallTableEnv{timer_, &detail::release_regions});
  {
    std::lock_guard lk(mu_);
    cells_[id] = cell;
  }
  rt_.add_cell(cell);
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
           {"bundle_index", opts.bundle_index()}, {"colocate", opts.colocate()}};
  auto res = call_head("POST", "/api/v1/actors", req);
  auto id = res.at("actor_id").get<std::uint64_t>();
  auto cell = make_cell(id, type.name, opts.name(), opts.max_retries(), opts.call_timeout());
  {
    std::lock_guard lk(mu_);
    owned_.insert(id);
  }
  return cell;
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
  if (watcher_.joinable()) watcher_.join();
  {   // the router calls back into this object: it must be gone before this object is
    caf::scoped_actor self{sys_};
    self->send_exit(router_, caf::exit_reason::user_shutdown);
    self->wait_for(router_);
  }
  std::map<std::string, std::shared_ptr<CallChannel>> channels;
  std::vector<std::shared_ptr<CallChannel>> retired;
  {
    std::lock_guard lk(mu_);
    gateways_.clear();
    channels.swap(channels_);
    retired.swap(retired_);
  }
  // Joins every reader this client ever started: none calls back into it after this.
  for (auto& [address, ch] : channels) ch->close();
  for (auto& ch : retired) ch->close();
}

void ClusterClient::watch_loop() {
  std::uint64_t since = 0;
  while (!stopping_) {
    json dir;
    try {
      dir = call_head("GET", "/api/v1/directory?since=" + std::to_string(since) + "&wait_ms=500", nullptr);
    } catch (const CallError& e) {
      spdlog::debug("directory: {}", e.what());
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      continue;
    }
    since = dir.value("version", since);
    for (const auto& a : dir.value("actors", json::array())) apply(a);
  }
}

void ClusterClient::apply(const json& a) {
  auto id = a.at("id").get<std::uint64_t>();
  std::shared_ptr<detail::ActorCell> cell;
  {
    std::lock_guard lk(mu_);
    if (auto it = cells_.find(id); it != cells_.end()) cell = it->second.lock();
  }
  if (!cell || cell->dead()) return;
  std::string state = a.value("state", "");
  auto incarnation = a.value("incarnation", std::uint64_t{0});
  auto route = cell->route();
  const auto* bound = dynamic_cast<const RemoteRoute*>(route.get());
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
  std::string gateway = a.value("gateway", "");
  if (gateway.empty()) return;
  caf::actor gw = connect(gateway);
  if (!gw) return;
  // Calls go straight to the actor's host (one hop less than through the gateway).
  caf::actor host;
  caf::scoped_actor self{sys_};
  self->request(gw, std::chrono::seconds(5), detail::host_atom::value, head_.token, id, incarnation)
      .receive([&](const caf::actor& h) { host = h; },
               [&](const caf::error& e) { spdlog::debug("host of {}: {}", id, sys_.render(e)); });
  if (!host) return;
  auto middleman = std::make_shared<MiddlemanRoute>(id, incarnation, gw, host, head_.token, router_);
  std::shared_ptr<detail::Route> next = middleman;
  if (auto ch = channel(gateway, gw)) next = std::make_shared<ChannelRoute>(id, incarnation, std::move(ch), middleman);
  cell->bind(std::move(next));
  cell->set_ready();
}

std::shared_ptr<CallChannel> ClusterClient::channel(const std::string& address, const caf::actor& gateway) {
  {
    std::lock_guard lk(mu_);
    if (stopping_ || !rt_.config().call_channel) return nullptr;
    if (auto it = channels_.find(address); it != channels_.end() && !it->second->broken()) return it->second;
  }
  std::string calls;
  caf::scoped_actor self{sys_};
  self->request(gateway, std::chrono::seconds(5), detail::calls_atom::value, head_.token)
      .receive([&](const std::string& a) { calls = a; },
               [&](const caf::error& e) { spdlog::debug("call channel of {}: {}", address, sys_.render(e)); });
  if (calls.empty()) return nullptr;
  // Replies complete their cells on the channel's reader thread; release notices for result
  // tensors still go to the gateway.
  auto ch = CallChannel::open(
      calls, head_.token,
      [rt = &rt_, gateway](detail::WireReply& r) {
        r.gateway = gateway;
        if (auto cell = rt->find(r.actor_id)) deliver_reply(*cell, r);
      },
      [this, address](const CallChannel* ch, bool closed_here) { on_channel_broken(address, ch, closed_here); },
      std::chrono::seconds(5));
  if (!ch) return nullptr;
  std::shared_ptr<CallChannel> unused;   // closed outside the lock: its reader may call back
  {
    std::lock_guard lk(mu_);
    auto found = channels_.find(address);
    if (stopping_) {
      unused = std::exchange(ch, nullptr);
    } else if (found != channels_.end() && !found->second->broken()) {
      // Another thread (the watcher, a host attaching a handle) opened one meanwhile: keep that
      // one, which may carry calls already, and close ours, which carries none. A channel is
      // never closed while it may still owe replies.
      unused = std::exchange(ch, found->second);
    } else if (found != channels_.end()) {
      retired_.push_back(std::exchange(found->second, ch));   // its reader is ending: stop() joins it
    } else {
      channels_.emplace(address, ch);
    }
  }
  // Every channel's reader ends before this client does: in the map, retired, or closed here.
  if (unused) unused->close();
  return ch;
}

caf::actor ClusterClient::connect(const std::string& address) {
  {
    std::lock_guard lk(mu_);
    if (auto it = gateways_.find(address); it != gateways_.end()) return it->second;
  }
  auto [host, port] = net::split_address(address);
  auto gw = sys_.middleman().remote_actor(host, port);
  if (!gw) {
    spdlog::debug("cannot connect to gateway {}: {}", address, sys_.render(gw.error()));
    return {};
  }
  caf::anon_send(router_, monitor_atom::value, *gw);
  std::lock_guard lk(mu_);
  gateways_[address] = *gw;
  return *gw;
}

void ClusterClient::on_channel_broken(const std::string& address, const CallChannel* broken, bool closed_here) {
  if (closed_here) return;   // closed by this client (stop, a dead worker, a spare): handled there
  std::shared_ptr<CallChannel> ch;
  std::vector<std::weak_ptr<detail::ActorCell>> bound;
  {
    std::lock_guard lk(mu_);
    if (stopping_) return;
    if (auto it = channels_.find(address); it != channels_.end() && it->second.get() == broken) {
      ch = it->second;   // the next binding opens a new one; new calls fall back at once
      retired_.push_back(std::move(it->second));   // joined by stop()
      channels_.erase(it);
    } else {   // replaced already (retired)
      for (const auto& r : retired_) {
        if (r.get() == broken) ch = r;
      }
    }
    if (!ch) return;
    for (auto& [id, weak] : cells_) bound.push_back(weak);
  }
  spdlog::info("call channel to the worker at {} ended; calls go through the middleman", address);
  // Usually the worker died: its gateway's monitor then fails or retries the calls in flight
  // (ActorDied) within moments. Calls still waiting on this channel after a grace period had a
  // live worker: they are resent by the middleman or fail with Unavailable (route_broken).
  timer_->schedule(detail::Timer::Clock::now() + kChannelGrace, [bound = std::move(bound), ch] {
    for (const auto& weak : bound) {
      auto cell = weak.lock();
      if (!cell) continue;
      auto route = cell->route();
      if (const auto* on = dynamic_cast<const ChannelRoute*>(route.get()); on != nullptr && on->channel() == ch.get()) {
        cell->route_broken(on, "lost its call channel");
      }
    }
  });
}

void ClusterClient::on_gateway_down(const caf::actor_addr& gateway) {
  std::vector<std::pair<std::shared_ptr<detail::ActorCell>, std::uint64_t>> lost;
  std::vector<std::shared_ptr<CallChannel>> gone;
  {
    std::lock_guard lk(mu_);
    for (auto it = gateways_.begin(); it != gateways_.end();) {
      if (it->second.address() != gateway) { ++it; continue; }
      if (auto ch = channels_.find(it->first); ch != channels_.end()) {
        gone.push_back(std::move(ch->second));
        channels_.erase(ch);
      }
      it = gateways_.erase(it);
    }
    for (auto& [id, weak] : cells_) {
      auto cell = weak.lock();
      if (!cell) continue;
      auto route = cell->route();
      const auto* on = dynamic_cast<const RemoteRoute*>(route.get());
      if (on != nullptr && on->gateway().address() == gateway) lost.push_back({cell, on->incarnation()});
    }
  }
  for (auto& ch : gone) ch->close();   // on the router's thread: never a reader's own
  for (auto& [cell, incarnation] : lost) cell->unbind(incarnation, "lost its worker process");
}

}  // namespace troupe::cluster
