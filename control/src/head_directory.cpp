// The head's state transitions: nodes join and die, workers start and exit, actors are placed,
// started, restarted (keeping their id, with a new incarnation: FT-2) or buried.
#include <spdlog/spdlog.h>

#include "troupe/control/head.hpp"
#include "troupe/ids.hpp"

namespace troupe::control {
namespace {

using json = nlohmann::json;


std::int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

placement::Resources parse_resources(const std::string& text) {
  auto r = placement::Resources::parse(text);
  if (!r.ok()) throw std::invalid_argument("bad resources '" + text + "': " + r.error().message);
  return *r;
}

}  // namespace

net::HttpResponse Head::register_node(const json& body) {
  std::string resources = body.value("resources", "");
  auto total = parse_resources(resources);
  std::lock_guard lk(mu_);
  std::uint64_t id = next_node_++;
  Node& n = nodes_[id];
  n.row = NodeRow{std::to_string(id), body.value("address", "127.0.0.1"), body.value("hostname", ""), "alive",
                  total.to_string(), total.to_string(), body.value("pid", std::int64_t{0}), now_ms(), now_ms()};
  n.last_seen = std::chrono::steady_clock::now();
  if (auto st = scheduler_.add_node(id, total); !st.ok()) throw std::invalid_argument(st.error().to_string());
  save(n.row);
  spdlog::info("head: node {} joined from {} with {}", id, n.row.address, n.row.resources);
  after_release();
  changed();
  return reply(200, json{{"node_id", id}, {"session_dir", config_.session_dir},
                         {"poll_hold_ms", config_.poll_hold.count()}});
}

net::HttpResponse Head::node_events(std::uint64_t id, const json& body) {
  std::lock_guard lk(mu_);
  if (!nodes_.count(id)) return error_reply(404, "unknown node " + std::to_string(id));
  for (const auto& e : body.at("events")) {
    if (e.value("kind", "") != "worker_exited") continue;
    auto it = workers_.find(e.at("worker_id").get<std::uint64_t>());
    if (it == workers_.end() || it->second.node != id) continue;
    on_worker_lost(it->second, "its worker process exited (" + e.value("status", std::string("?")) + ")");
  }
  changed();
  return reply(200, json::object());
}

net::HttpResponse Head::worker_ready(std::uint64_t id, const json& body) {
  std::lock_guard lk(mu_);
  auto it = workers_.find(id);
  if (it == workers_.end() || it->second.state == "dead") return reply(200, json{{"state", "dead"}});
  Worker& w = it->second;
  w.state = "alive";
  w.gateway = body.at("gateway").get<std::string>();
  w.pid = body.value("pid", std::int64_t{0});
  spdlog::info("head: worker {} on node {} is up at {} (pid {})", id, w.node, w.gateway, w.pid);
  return reply(200, json{{"state", w.state}});
}

net::HttpResponse Head::worker_events(std::uint64_t id, const json& body) {
  std::lock_guard lk(mu_);
  auto wit = workers_.find(id);
  if (wit == workers_.end()) return error_reply(404, "unknown worker " + std::to_string(id));
  Worker& w = wit->second;
  for (const auto& e : body.at("events")) {
    auto ait = actors_.find(e.at("actor_id").get<std::uint64_t>());
    if (ait == actors_.end() || ait->second.worker_id != std::to_string(id)) continue;
    ActorRow& a = ait->second;
    if (e.value("incarnation", std::uint64_t{0}) != a.incarnation || a.state == "dead") continue;   // stale (FT-2)
    if (e.value("kind", "") == "actor_ready") {
      a.state = "alive";
      a.gateway = w.gateway;
      a.pid = w.pid;
    } else {
      a.state = "dead";
      a.death_reason = "its constructor failed: " + e.value("reason", std::string("unknown"));
      (void)scheduler_.release_actor(a.id);
      w.actors.erase(a.id);
      if (w.actors.empty()) w.commands.push_back(json{{"kind", "exit"}});
    }
    save(a);
  }
  changed();
  return reply(200, json::object());
}

net::HttpResponse Head::create_actor(const json& body) {
  ActorRow a;
  a.type = body.at("type").get<std::string>();
  a.name = body.value("name", "");
  a.ctor_signature = body.at("ctor_signature").get<std::string>();
  a.ctor_args = body.at("ctor_args").get<std::string>();   // hex
  a.max_restarts = body.value("max_restarts", std::int64_t{0});
  a.resources = body.value("resources", "");
  parse_resources(a.resources);   // reject bad strings before anything is stored
  if (a.type.empty()) throw std::invalid_argument("type must not be empty");
  if (a.max_restarts < -1) throw std::invalid_argument("max_restarts must be -1 (unlimited) or more");
  json spec{{"binary", body.at("binary").get<std::string>()}, {"max_retries", body.value("max_retries", 0)},
            {"placement_group", body.value("placement_group", std::uint64_t{0})},
            {"bundle_index", body.value("bundle_index", -1)}, {"colocate", body.value("colocate", false)}};
  a.spec = spec.dump();
  std::uint64_t colocate_with = body.value("colocate_with", std::uint64_t{0});
  std::lock_guard lk(mu_);
  if (colocate_with != 0) {
    auto t = actors_.find(colocate_with);
    if (t == actors_.end() || t->second.state == "dead" || t->second.worker_id.empty()) {
      return error_reply(409, "cannot colocate with actor " + std::to_string(colocate_with) + ": it is not running");
    }
  }
  a.id = kClusterActorBase + next_actor_++;
  store_->put_meta("next_actor", std::to_string(next_actor_));
  a.state = "pending";
  auto [it, _] = actors_.emplace(a.id, std::move(a));
  place_and_start(it->second, colocate_with);
  save(it->second);
  changed();
  return reply(200, json{{"actor_id", it->first}, {"state", it->second.state}});
}

net::HttpResponse Head::kill_actor(std::uint64_t id, const std::string& reason) {
  std::lock_guard lk(mu_);
  auto it = actors_.find(id);
  if (it == actors_.end()) return error_reply(404, "unknown actor " + std::to_string(id));
  ActorRow& a = it->second;
  if (a.state != "dead") {
    bury(a, reason);
    after_release();
    changed();
  }
  return reply(200, actor_json(a));
}

net::HttpResponse Head::get_actor(std::uint64_t id) {
  std::lock_guard lk(mu_);
  auto it = actors_.find(id);
  if (it == actors_.end()) return error_reply(404, "unknown actor " + std::to_string(id));
  return reply(200, actor_json(it->second));
}

void Head::place_and_start(ActorRow& a, std::uint64_t colocate_with) {
  std::string binary = json::parse(a.spec).at("binary").get<std::string>();
  if (colocate_with != 0) {
    ActorRow& target = actors_.at(colocate_with);
    start_on_worker(workers_.at(std::stoull(target.worker_id)), a);
    return;
  }
  json spec = json::parse(a.spec);
  placement::ActorRequest req{a.id, parse_resources(a.resources), {}, false, {}};
  if (auto group = spec.value("placement_group", std::uint64_t{0}); group != 0) {
    req.bundle = placement::BundleRef{group, spec.value("bundle_index", -1)};
    req.colocate = spec.value("colocate", false);
  }
  auto placed = scheduler_.place_actor(req);
  if (!placed.ok()) {
    if (placed.error().code == PlacementCode::InvalidArgument ||
        placed.error().code == PlacementCode::NotFound) {
      a.state = "dead";   // can never be placed: a bad bundle index, a removed group
      a.death_reason = "cannot be placed: " + placed.error().message;
      return;
    }
    a.worker_id.clear();   // waits, pending, until a node or a bundle with room appears
    a.node_id.clear();
    a.death_reason = "waiting for resources: " + placed.error().message;
    spdlog::info("head: actor {} is pending: {}", a.id, placed.error().to_string());
    return;
  }
  start_on_worker(*worker_for(*placed, binary), a);
}

Head::Worker* Head::worker_for(const placement::Placement& p, const std::string& binary) {
  auto it = process_workers_.find(p.worker.process);
  if (it != process_workers_.end()) {
    auto w = workers_.find(it->second);
    if (w != workers_.end() && w->second.state != "dead") return &w->second;
  }
  Worker& w = new_worker(p.node, binary);
  process_workers_[p.worker.process] = w.id;
  return &w;
}

Head::Worker& Head::new_worker(std::uint64_t node, const std::string& binary) {
  std::uint64_t id = next_worker_++;
  Worker& w = workers_[id];
  w.id = id;
  w.node = node;
  nodes_.at(node).commands.push_back(json{{"kind", "start_worker"}, {"worker_id", id}, {"binary", binary}});
  return w;
}

void Head::start_on_worker(Worker& w, ActorRow& a) {
  a.worker_id = std::to_string(w.id);
  a.node_id = std::to_string(w.node);
  a.gateway.clear();
  a.death_reason.clear();
  a.incarnation += 1;
  w.actors.insert(a.id);
  w.commands.push_back(json{{"kind", "spawn"}, {"actor_id", a.id}, {"type", a.type}, {"name", a.name},
                            {"ctor_signature", a.ctor_signature}, {"ctor_args", a.ctor_args},
                            {"incarnation", a.incarnation}, {"spec", a.spec}});
}

void Head::on_worker_lost(Worker& w, const std::string& why) {
  if (w.state == "dead") return;
  w.state = "dead";
  w.commands.clear();
  if (auto n = nodes_.find(w.node); n != nodes_.end() && n->second.row.state == "alive") {
    n->second.commands.push_back(json{{"kind", "kill_worker"}, {"worker_id", w.id}});
  }
  if (w.actors.empty()) spdlog::info("head: worker {} on node {} ended: {}", w.id, w.node, why);
  else spdlog::warn("head: worker {} on node {} lost: {}", w.id, w.node, why);
  std::map<std::uint64_t, Worker*> regroup;   // colocated actors restart together
  auto members = w.actors;
  w.actors.clear();
  for (auto aid : members) restart_or_bury(actors_.at(aid), why, regroup);
  after_release();
}

void Head::bury(ActorRow& a, const std::string& why) {
  a.state = "dead";
  a.death_reason = why;
  (void)scheduler_.release_actor(a.id);
  if (auto w = workers_.find(a.worker_id.empty() ? 0 : std::stoull(a.worker_id)); w != workers_.end()) {
    w->second.actors.erase(a.id);
    w->second.commands.push_back(json{{"kind", "kill"}, {"actor_id", a.id}});
    if (w->second.actors.empty()) w->second.commands.push_back(json{{"kind", "exit"}});
  }
  save(a);
}

void Head::restart_or_bury(ActorRow& a, const std::string& why, std::map<std::uint64_t, Worker*>& regroup) {
  if (a.state == "dead") return;
  (void)scheduler_.release_actor(a.id);
  std::uint64_t old_worker = a.worker_id.empty() ? 0 : std::stoull(a.worker_id);
  if (a.max_restarts >= 0 && a.restarts >= a.max_restarts) {
    a.state = "dead";
    a.death_reason = why + "; no restarts left (" + std::to_string(a.restarts) + " of " +
                     std::to_string(a.max_restarts) + " used)";
    save(a);
    return;
  }
  a.restarts += 1;
  a.state = "restarting";
  if (auto it = regroup.find(old_worker); it != regroup.end()) {
    start_on_worker(*it->second, a);
  } else {
    place_and_start(a, 0);
    if (!a.worker_id.empty()) regroup[old_worker] = &workers_.at(std::stoull(a.worker_id));
  }
  spdlog::info("head: restarting actor {} ({}), restart {}", a.id, why, a.restarts);
  save(a);
}

void Head::on_node_dead(Node& n, const std::string& why) {
  n.row.state = "dead";
  n.commands.clear();
  std::uint64_t id = std::stoull(n.row.id);
  (void)scheduler_.mark_dead(id);
  spdlog::warn("head: node {} is dead: {}", id, why);
  save(n.row);
  for (auto& [wid, w] : workers_) {
    if (w.node == id) on_worker_lost(w, "its node " + std::to_string(id) + " died (" + why + ")");
  }
  changed();
}

void Head::after_release() {
  (void)scheduler_.take_ready_groups();   // their state shows in GET; actors waiting on them retry below
  for (auto& [aid, a] : actors_) {
    if ((a.state == "pending" || a.state == "restarting") && a.worker_id.empty()) place_and_start(a, 0);
  }
}

void Head::save(const ActorRow& a) {
  try {
    store_->put_actor(a);
  } catch (const ErrorException& e) {   // ControlCode::Store
    spdlog::error("head: {}", e.what());
  }
}

void Head::save(const NodeRow& n) {
  try {
    store_->put_node(n);
  } catch (const ErrorException& e) {
    spdlog::error("head: {}", e.what());
  }
}

json Head::actor_json(const ActorRow& a) const {
  return json{{"id", a.id}, {"type", a.type}, {"name", a.name}, {"state", a.state}, {"node", a.node_id},
              {"worker", a.worker_id}, {"pid", a.pid}, {"gateway", a.gateway}, {"incarnation", a.incarnation},
              {"restarts", a.restarts}, {"max_restarts", a.max_restarts}, {"resources", a.resources},
              {"reason", a.death_reason}};
}

json Head::node_json(const Node& n) const {
  std::string available = n.row.state == "alive" ? "" : n.row.available;
  if (auto v = scheduler_.node(std::stoull(n.row.id)); v && n.row.state == "alive") available = v->available.to_string();
  auto seen = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - n.last_seen);
  return json{{"id", std::stoull(n.row.id)}, {"address", n.row.address}, {"hostname", n.row.hostname},
              {"state", n.row.state}, {"resources", n.row.resources}, {"available", available},
              {"pid", n.row.pid}, {"last_seen_ms_ago", seen.count()}};
}

}  // namespace troupe::control
