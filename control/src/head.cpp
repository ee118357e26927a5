// The head's HTTP surface: thin adapters from JSON requests to HeadState's typed calls (and its
// errors to status codes), the long polls, and the failure detector.
#include "troupe/control/head.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>

#include "head_state.hpp"
#include "troupe/net/token.hpp"

namespace troupe::control {
namespace {

using json = nlohmann::json;

// "/123/poll" -> (123, "poll"); id 0 when the segment is not a number.
std::pair<std::uint64_t, std::string> split_id(const std::string& rest) {
  auto slash = rest.find('/', 1);
  std::string id_text = rest.substr(1, slash == std::string::npos ? std::string::npos : slash - 1);
  std::uint64_t id = 0;
  try {
    std::size_t used = 0;
    id = std::stoull(id_text, &used);
    if (used != id_text.size()) id = 0;
  } catch (const std::exception&) {
    id = 0;
  }
  return {id, slash == std::string::npos ? "" : rest.substr(slash + 1)};
}

// A typed error as the API answers it.
net::HttpResponse error_reply(const Error& e) {
  int status = 500;
  if (e.code == ControlCode::BadRequest) status = 400;
  else if (e.code == ControlCode::NotFound) status = 404;
  else if (e.code == ControlCode::Conflict) status = 409;
  return control::error_reply(status, e.message);
}

// body[key] as T, BadRequest naming it when missing or mistyped.
template <class T>
T field(const json& body, const char* key) {
  auto it = body.find(key);
  if (it == body.end()) throw ErrorException(Error{ControlCode::BadRequest, std::string("missing field '") + key + "'"});
  try {
    return it->get<T>();
  } catch (const json::exception&) {
    throw ErrorException(Error{ControlCode::BadRequest, std::string("field '") + key + "' has the wrong type"});
  }
}

const json& events_of(const json& body) {
  const json& events = body.is_object() && body.contains("events") ? body.at("events") : body;
  if (!events.is_array()) throw ErrorException(Error{ControlCode::BadRequest, "'events' must be an array"});
  return events;
}

json parse_body(const std::string& body) { return json::parse(body.empty() ? "{}" : body); }

long wait_ms_of(const net::HttpRequest& req) {
  auto it = req.query.find("wait_ms");
  if (it == req.query.end()) return 0;
  try {
    return std::clamp(std::stol(it->second), 0L, 5000L);
  } catch (const std::exception&) {
    throw ErrorException(Error{ControlCode::BadRequest, "wait_ms must be a number"});
  }
}

std::int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

Head::Head(HeadConfig config) : config_(std::move(config)) {
  if (config_.token.empty()) throw std::invalid_argument("the head needs a cluster token");
  std::filesystem::create_directories(config_.session_dir);
  store_ = open_sqlite_store((std::filesystem::path(config_.session_dir) / "store.db").string());
  state_ = std::make_unique<HeadState>(*store_);
  store_->put_meta("started_ms", std::to_string(now_ms()));
  detector_ = std::thread([this] { detector_loop(); });
  try {
    server_ = std::make_unique<net::HttpServer>(config_.bind, config_.port, [this](const net::HttpRequest& r) { return route(r); });
  } catch (...) {
    stop();
    throw;
  }
  spdlog::info("head: listening on {}", address());
}

Head::~Head() { stop(); }

void Head::stop() {
  {
    std::lock_guard lk(mu_);
    if (stopping_ && !detector_.joinable()) return;
    stopping_ = true;
  }
  cv_.notify_all();
  if (server_) server_->stop();
  if (detector_.joinable()) detector_.join();
}

net::HttpResponse Head::route(const net::HttpRequest& req) {
  if (!net::token_matches(req.bearer, config_.token)) {
    spdlog::warn("head: refused {} {} from {}: missing or wrong cluster token", req.method, req.path, req.peer);
    return control::error_reply(401, "missing or wrong cluster token");
  }
  static const std::string kApi = "/api/v1";
  if (req.path.rfind(kApi, 0) != 0) return control::error_reply(404, "no such endpoint: " + req.path);
  std::string rest = req.path.substr(kApi.size());
  try {
    if (rest == "/status" && req.method == "GET") return status();
    if (rest == "/directory" && req.method == "GET") return directory(req);
    if (rest == "/nodes" && req.method == "POST") return register_node(json::parse(req.body));
    if (rest == "/actors" && req.method == "POST") return create_actor(json::parse(req.body));
    if (rest == "/placement_groups" && req.method == "POST") return create_group(json::parse(req.body));
    if (rest.rfind("/placement_groups/", 0) == 0) return route_group(req, rest.substr(17));
    if (rest.rfind("/nodes/", 0) == 0) return route_node(req, rest.substr(6));
    if (rest.rfind("/workers/", 0) == 0) return route_worker(req, rest.substr(8));
    if (rest.rfind("/actors/", 0) == 0) return route_actor(req, rest.substr(7));
  } catch (const json::exception& e) {
    return control::error_reply(400, std::string("bad request body: ") + e.what());
  } catch (const ErrorException& e) {
    return error_reply(e.error());
  }
  return control::error_reply(404, "no such endpoint: " + req.method + " " + req.path);
}

net::HttpResponse Head::route_node(const net::HttpRequest& req, const std::string& rest) {
  auto [id, verb] = split_id(rest);
  if (id == 0) return control::error_reply(404, "bad node id");
  if (verb == "poll" && req.method == "POST") return poll_node(id);
  if (verb == "events" && req.method == "POST") return node_events(id, json::parse(req.body));
  return control::error_reply(404, "no such node endpoint");
}

net::HttpResponse Head::route_worker(const net::HttpRequest& req, const std::string& rest) {
  auto [id, verb] = split_id(rest);
  if (id == 0) return control::error_reply(404, "bad worker id");
  if (verb == "ready" && req.method == "POST") return worker_ready(id, json::parse(req.body));
  if (verb == "poll" && req.method == "POST") return poll_worker(id);
  if (verb == "events" && req.method == "POST") return worker_events(id, json::parse(req.body));
  return control::error_reply(404, "no such worker endpoint");
}

net::HttpResponse Head::route_actor(const net::HttpRequest& req, const std::string& rest) {
  auto [id, verb] = split_id(rest);
  if (id == 0) return control::error_reply(404, "bad actor id");
  if (verb.empty() && req.method == "GET") return get_actor(id);
  if (verb == "kill" && req.method == "POST") {
    auto body = parse_body(req.body);
    return kill_actor(id, body.is_object() ? body.value("reason", "was killed") : "was killed");
  }
  return control::error_reply(404, "no such actor endpoint");
}

net::HttpResponse Head::route_group(const net::HttpRequest& req, const std::string& rest) {
  auto [id, verb] = split_id(rest);
  if (id == 0) return control::error_reply(404, "bad placement group id");
  if (verb.empty() && req.method == "GET") return get_group(id, std::chrono::milliseconds(wait_ms_of(req)));
  if (verb == "remove" && req.method == "POST") return remove_group(id);
  return control::error_reply(404, "no such placement group endpoint");
}

// ---- nodes ----

net::HttpResponse Head::register_node(const json& body) {
  if (!body.is_object()) return control::error_reply(400, "a node registration is a JSON object");
  NodeRecord rec;
  const auto resources = field<std::string>(body, "resources");
  auto total = placement::Resources::parse(resources);
  if (!total.ok()) return control::error_reply(400, "bad resources '" + resources + "': " + total.error().message);
  rec.total = *total;
  rec.address = body.value("address", "127.0.0.1");
  rec.hostname = body.value("hostname", "");
  rec.pid = body.value("pid", std::int64_t{0});
  std::lock_guard lk(mu_);
  auto id = state_->register_node(std::move(rec));
  if (!id.ok()) return error_reply(id.error());
  changed();
  return reply(200, json{{"node_id", *id}, {"session_dir", config_.session_dir},
                         {"poll_hold_ms", config_.poll_hold.count()}});
}

net::HttpResponse Head::poll_node(std::uint64_t id) {
  std::unique_lock lk(mu_);
  auto state = state_->node_seen(id);
  if (!state.ok()) return error_reply(state.error());
  if (*state == NodeState::Alive) {
    cv_.wait_for(lk, config_.poll_hold, [&] {
      auto* n = state_->nodes().find(id);
      return stopping_ || n == nullptr || !n->commands.empty() || n->rec.state != NodeState::Alive;
    });
    state = state_->node_seen(id);
    if (!state.ok()) return error_reply(state.error());
  }
  json cmds = json::array();
  for (const auto& c : state_->take_node_commands(id)) cmds.push_back(c.to_json());
  return reply(200, json{{"state", std::string(to_string(*state))}, {"commands", cmds}});
}

net::HttpResponse Head::node_events(std::uint64_t id, const json& body) {
  std::lock_guard lk(mu_);
  for (const auto& e : events_of(body)) {
    if (!e.is_object() || e.value("kind", "") != "worker_exited") continue;
    auto st = state_->worker_exited(id, field<std::uint64_t>(e, "worker_id"), e.value("status", std::string("?")));
    if (!st.ok()) return error_reply(st.error());
  }
  if (state_->nodes().find(id) == nullptr) return error_reply(Error{ControlCode::NotFound, "unknown node " + std::to_string(id)});
  changed();
  return reply(200, json::object());
}

// ---- workers ----

net::HttpResponse Head::worker_ready(std::uint64_t id, const json& body) {
  if (!body.is_object()) return control::error_reply(400, "a ready report is a JSON object");
  auto gateway = field<std::string>(body, "gateway");
  std::lock_guard lk(mu_);
  auto state = state_->worker_ready(id, std::move(gateway), body.value("pid", std::int64_t{0}));
  if (!state.ok()) return error_reply(state.error());
  return reply(200, json{{"state", std::string(to_string(*state))}});
}

net::HttpResponse Head::poll_worker(std::uint64_t id) {
  std::unique_lock lk(mu_);
  auto state = state_->worker_state(id);
  if (!state.ok()) return error_reply(state.error());
  cv_.wait_for(lk, config_.poll_hold, [&] {
    auto* w = state_->workers().find(id);
    return stopping_ || w == nullptr || !w->commands.empty() || w->state == WorkerState::Dead;
  });
  state = state_->worker_state(id);
  if (!state.ok()) return error_reply(state.error());
  json cmds = json::array();
  for (const auto& c : state_->take_worker_commands(id)) cmds.push_back(c.to_json());
  return reply(200, json{{"state", std::string(to_string(*state))}, {"commands", cmds}});
}

net::HttpResponse Head::worker_events(std::uint64_t id, const json& body) {
  std::vector<ActorEvent> events;
  for (const auto& e : events_of(body)) {
    if (!e.is_object()) return control::error_reply(400, "an event is a JSON object");
    ActorEvent ev;
    ev.actor = field<std::uint64_t>(e, "actor_id");
    ev.incarnation = e.value("incarnation", std::uint64_t{0});
    ev.ready = e.value("kind", "") == "actor_ready";
    ev.reason = e.value("reason", std::string());
    events.push_back(std::move(ev));
  }
  std::lock_guard lk(mu_);
  auto st = state_->actor_events(id, events);
  if (!st.ok()) return error_reply(st.error());
  changed();
  return reply(200, json::object());
}

// ---- actors ----

net::HttpResponse Head::create_actor(const json& body) {
  auto spec = SpawnSpec::from_json(body);
  if (!spec.ok()) return error_reply(spec.error());
  std::lock_guard lk(mu_);
  auto a = state_->create_actor(std::move(*spec));
  if (!a.ok()) return error_reply(a.error());
  changed();
  return reply(200, json{{"actor_id", (*a)->id}, {"state", std::string(to_string((*a)->state))}});
}

net::HttpResponse Head::kill_actor(std::uint64_t id, const std::string& reason) {
  std::lock_guard lk(mu_);
  auto a = state_->kill_actor(id, reason);
  if (!a.ok()) return error_reply(a.error());
  changed();
  return reply(200, actor_json(**a));
}

net::HttpResponse Head::get_actor(std::uint64_t id) {
  std::lock_guard lk(mu_);
  const ActorRecord* a = state_->actor(id);
  if (a == nullptr) return control::error_reply(404, "unknown actor " + std::to_string(id));
  return reply(200, actor_json(*a));
}

// ---- placement groups ----

net::HttpResponse Head::create_group(const json& body) {
  if (!body.is_object()) return control::error_reply(400, "a placement group request is a JSON object");
  placement::PlacementGroupSpec spec;
  const auto bundles = field<std::vector<std::string>>(body, "bundles");
  for (const auto& b : bundles) {
    auto r = placement::Resources::parse(b);
    if (!r.ok()) return control::error_reply(400, "bad bundle '" + b + "': " + r.error().message);
    spec.bundles.push_back(*r);
  }
  auto strategy = placement::parse_strategy(body.value("strategy", "PACK"));
  if (!strategy.ok()) return control::error_reply(400, strategy.error().message);
  spec.strategy = *strategy;
  spec.name = body.value("name", "");
  spec.wait_if_unplaced = body.value("wait", true);
  std::lock_guard lk(mu_);
  auto created = state_->create_group(std::move(spec));
  if (!created.ok()) return error_reply(created.error());
  changed();
  return reply(200, json{{"id", created->id}, {"state", std::string(placement::to_string(created->state))},
                         {"reason", created->reason.ok() ? "" : created->reason.error().to_string()}});
}

net::HttpResponse Head::get_group(std::uint64_t id, std::chrono::milliseconds wait) {
  std::unique_lock lk(mu_);
  auto g = state_->group(id);
  if (!g) return control::error_reply(404, "unknown placement group " + std::to_string(id));
  // ?wait_ms=N: a group still waiting for room is answered when its state changes (or at N).
  const auto state = g->state;
  if (state == placement::GroupState::kPending || state == placement::GroupState::kRescheduling) {
    cv_.wait_for(lk, wait, [&] {
      auto now = state_->group(id);
      return stopping_ || !now || now->state != state;
    });
    g = state_->group(id);
    if (!g) return control::error_reply(404, "placement group " + std::to_string(id) + " was removed");
  }
  return reply(200, group_json(*g));
}

net::HttpResponse Head::remove_group(std::uint64_t id) {
  std::lock_guard lk(mu_);
  auto removed = state_->remove_group(id);
  if (!removed.ok()) return error_reply(removed.error());
  changed();
  return reply(200, json{{"removed", id}, {"killed_actors", *removed}});
}

// ---- views ----

net::HttpResponse Head::directory(const net::HttpRequest& req) {
  std::uint64_t since = 0;
  try {
    if (auto it = req.query.find("since"); it != req.query.end()) since = std::stoull(it->second);
  } catch (const std::exception&) {
    return control::error_reply(400, "since must be a number");
  }
  const long wait_ms = wait_ms_of(req);
  std::unique_lock lk(mu_);
  cv_.wait_for(lk, std::chrono::milliseconds(wait_ms), [&] { return stopping_ || version_ > since; });
  json actors = json::array();
  for (const auto& [aid, a] : state_->actors().all()) actors.push_back(actor_json(a));
  json nodes = json::array();
  for (const auto& [nid, n] : state_->nodes().all()) nodes.push_back(node_json(nid));
  return reply(200, json{{"version", version_}, {"actors", actors}, {"nodes", nodes}});
}

net::HttpResponse Head::status() {
  std::lock_guard lk(mu_);
  json nodes = json::array();
  for (const auto& [nid, n] : state_->nodes().all()) nodes.push_back(node_json(nid));
  json actors = json::array();
  for (const auto& [aid, a] : state_->actors().all()) actors.push_back(actor_json(a));
  json groups = json::array();
  for (const auto& [gid, rec] : state_->groups().all()) {
    if (auto g = state_->group(gid)) groups.push_back(group_json(*g));
  }
  return reply(200, json{{"head", address()}, {"session_dir", config_.session_dir},
                         {"logs", (std::filesystem::path(config_.session_dir) / "logs").string()},
                         {"nodes", nodes}, {"actors", actors}, {"placement_groups", groups}});
}

// "node" and "worker" are numbers, 0 while the actor has none.
json Head::actor_json(const ActorRecord& a) const {
  return json{{"id", a.id}, {"type", a.spec.type}, {"name", a.spec.name}, {"state", std::string(to_string(a.state))},
              {"node", a.node}, {"worker", a.worker}, {"pid", a.pid}, {"gateway", a.gateway},
              {"incarnation", a.incarnation}, {"restarts", a.restarts}, {"max_restarts", a.spec.max_restarts},
              {"resources", a.spec.resources.to_string()}, {"reason", a.reason}};
}

json Head::node_json(std::uint64_t id) {
  const auto* n = state_->nodes().find(id);
  auto available = state_->available(id);
  auto seen = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - n->last_seen);
  return json{{"id", id}, {"address", n->rec.address}, {"hostname", n->rec.hostname},
              {"state", std::string(to_string(n->rec.state))}, {"resources", n->rec.total.to_string()},
              {"available", available ? available->to_string() : std::string()}, {"pid", n->rec.pid},
              {"last_seen_ms_ago", seen.count()}};
}

json Head::group_json(const placement::GroupView& g) const {
  json bundles = json::array();
  for (std::size_t i = 0; i < g.bundles.size(); ++i) {
    bundles.push_back(json{{"resources", g.bundles[i].to_string()},
                           {"node", g.bundle_nodes[i] ? json(*g.bundle_nodes[i]) : json(nullptr)},
                           {"available", g.bundle_available[i].to_string()}});
  }
  return json{{"id", g.id}, {"name", g.name}, {"strategy", std::string(placement::to_string(g.strategy))},
              {"state", std::string(placement::to_string(g.state))}, {"bundles", bundles}, {"actors", g.actors}};
}

// ---- failure detection ----

void Head::detector_loop() {
  std::unique_lock lk(mu_);
  while (!stopping_) {
    cv_.wait_for(lk, std::chrono::milliseconds(100));   // a clock, not a poll: node deadlines pass without an event
    if (stopping_) break;
    if (state_->expire_nodes(config_.node_timeout)) changed();
  }
}

void Head::changed() {
  ++version_;
  cv_.notify_all();
}

}  // namespace troupe::control
