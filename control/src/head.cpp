// The head's HTTP surface: thin adapters from JSON requests to HeadState's typed calls (and its
// errors to status codes), the long polls, and the failure detector.
#include "troupe/control/head.hpp"

#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>
#include <set>

#include "head_state.hpp"
#include "job_logs.hpp"
#include "troupe/control/package.hpp"
#include "troupe/ids.hpp"
#include "troupe/net/address.hpp"
#include "troupe/net/head_link.hpp"
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

// read_field's value, thrown as its BadRequest for the handler's catch to answer.
template <class T>
T field(const json& body, const char* key, std::optional<T> fallback = std::nullopt) {
  auto r = read_field<T>(body, key, std::move(fallback));
  if (!r.ok()) throw ErrorException(r.error());
  return std::move(r).value();
}

const json& events_of(const json& body) {
  auto it = body.find("events");
  if (it == body.end() || !it->is_array()) throw ErrorException(Error{ControlCode::BadRequest, "'events' must be an array"});
  return *it;
}

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

json parse_request(const std::string& body) {
  if (!net::json_nesting_within(body))
    throw ErrorException(Error{ControlCode::BadRequest, "the body nests deeper than " + std::to_string(net::kMaxJsonDepth) + " levels"});
  return json::parse(body.empty() ? "{}" : body);
}

Head::Head(HeadConfig config) : config_(std::move(config)) {
  if (config_.token.empty()) throw std::invalid_argument("the head needs a cluster token");
  std::filesystem::create_directories(config_.session_dir);
  store_ = open_sqlite_store((std::filesystem::path(config_.session_dir) / "store.db").string());
  state_ = std::make_unique<HeadState>(*store_);
  logs_ = std::make_unique<JobLogs>((std::filesystem::path(config_.session_dir) / "jobs").string(),
                                    config_.job_log_bytes, config_.job_logs_total_bytes);
  for (const auto& [id, j] : state_->jobs().all()) {
    if (!ended(j.state)) logs_->open(id);
  }
  packages_ = std::make_unique<PackageCache>((std::filesystem::path(config_.session_dir) / "packages").string(),
                                             config_.package_store_bytes);
  store_->put_meta("started_ms", std::to_string(now_ms()));
  net::LinkOptions options;
  options.silence_limit = config_.node_timeout;   // a frozen daemon (SIGSTOP) is dead after this
  options.heartbeat = std::max(std::chrono::milliseconds(50), config_.node_timeout / 5);
  options.send_timeout = std::chrono::milliseconds(2000);   // a peer that stops reading holds the head no longer
  detector_ = std::thread([this] { detector_loop(); });
  owner_wake_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (owner_wake_ >= 0) owner_watch_ = std::thread([this] { owner_watch_loop(); });
  try {
    links_ = std::make_unique<net::LinkHub>(config_.token, net::self_identity("head"), options);
    link_address_ = links_->listen(config_.bind, [this](const std::shared_ptr<net::Link>& l) { on_link(l); });
    server_ = std::make_unique<net::HttpServer>(config_.bind, config_.port, [this](const net::HttpRequest& r) { return route(r); },
                                                std::vector<std::string>{"/api/v1/packages/"}, config_.token);
  } catch (...) {
    stop();
    throw;
  }
  spdlog::info("head: listening on {} (HTTP) and {} (links)", address(), link_address_);
}

Head::~Head() { stop(); }

void Head::stop() {
  {
    std::lock_guard lk(mu_);
    if (stopping_ && !detector_.joinable()) return;
    stopping_ = true;
  }
  cv_.notify_all();
  wake_owner_watch();
  if (logs_) logs_->stop();   // followers of job logs return
  if (server_) server_->stop();
  if (links_) links_->stop();
  if (detector_.joinable()) detector_.join();
  if (owner_watch_.joinable()) owner_watch_.join();
  std::lock_guard lk(mu_);
  for (auto& [l, peer] : peers_) {
    if (peer.pidfd >= 0) ::close(peer.pidfd);
  }
  peers_.clear();   // the links go before the hub that ran them
  if (owner_wake_ >= 0) ::close(owner_wake_);
  owner_wake_ = -1;
}

net::HttpResponse Head::route(const net::HttpRequest& req) {
  if (!net::token_matches(req.bearer, config_.token)) {
    spdlog::warn("head: refused {} {} from {}: missing or wrong cluster token", req.method, req.path, req.peer);
    return control::error_reply(401, "missing or wrong cluster token");
  }
  static const std::string kApi = "/api/v1";
  if (req.path.rfind(kApi, 0) != 0) return control::error_reply(404, "no such endpoint: " + req.path);
  std::string rest = req.path.substr(kApi.size());
  // What a request asks to start (an actor, a job, a group) reaches nodes and workers as an order,
  // a control message: a body that could not fit one is refused here, before anything is stored
  // (a package is a body of its own kind, bounded by max_package_bytes).
  constexpr std::size_t kOrderSlack = 64u << 10;   // what an order adds to the spec it carries
  if (req.method == "POST" && rest.rfind("/packages/", 0) != 0 && req.body.size() > net::kMaxControlMessage - kOrderSlack)
    return control::error_reply(Error{ControlCode::TooLarge, "a request body over " + std::to_string(net::kMaxControlMessage - kOrderSlack) +
                                                                 " bytes (an actor's or a job's spec must fit an order to a node)"});
  try {
    if (rest == "/status" && req.method == "GET") return status();
    if (rest == "/directory" && req.method == "GET") return directory(req);
    if (rest == "/link" && req.method == "GET") return reply(200, json{{"link", link_address_}});
    if (rest == "/actors" && req.method == "POST") return create_actor(parse_request(req.body));
    if (rest == "/actors/hosted" && req.method == "POST") return host_actor(parse_request(req.body));
    if (rest == "/placement_groups" && req.method == "POST") return create_group(parse_request(req.body));
    if (rest == "/elastic_groups" && req.method == "POST") return create_elastic(parse_request(req.body));
    if (rest.rfind("/nodes/", 0) == 0) return route_node(req, rest.substr(6));
    if (rest.rfind("/elastic_groups/", 0) == 0) return route_elastic(req, rest.substr(15));
    if (rest.rfind("/placement_groups/", 0) == 0) return route_group(req, rest.substr(17));
    if (rest.rfind("/actors/", 0) == 0) return route_actor(req, rest.substr(7));
    if (rest == "/jobs" || rest.rfind("/jobs/", 0) == 0) return route_jobs(req, rest.substr(5));
    if (rest.rfind("/packages/", 0) == 0) return route_package(req, rest.substr(10));
  } catch (const json::exception& e) {
    return control::error_reply(400, std::string("bad request body: ") + e.what());
  } catch (const ErrorException& e) {
    return error_reply(e.error());
  }
  return control::error_reply(404, "no such endpoint: " + req.method + " " + req.path);
}

net::HttpResponse Head::route_actor(const net::HttpRequest& req, const std::string& rest) {
  auto [id, verb] = split_id(rest);
  if (id == 0) return control::error_reply(404, "bad actor id");
  if (verb.empty() && req.method == "GET") return get_actor(id);
  if (verb == "kill" && req.method == "POST") {
    auto body = parse_request(req.body);
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

// ---- actors ----

net::HttpResponse Head::create_actor(const json& body) {
  auto spec = SpawnSpec::from_json(body);
  if (!spec.ok()) return error_reply(spec.error());
  std::lock_guard lk(mu_);
  if (!owner_linked(spec->owner)) {
    return control::error_reply(409, "owner " + std::to_string(spec->owner) + " is not connected");
  }
  auto a = state_->create_actor(std::move(*spec));
  if (!a.ok()) return error_reply(a.error());
  changed();
  return reply(200, json{{"actor_id", (*a)->id}, {"state", std::string(to_string((*a)->state))}});
}

// A process's own in-process actor, made callable from others: {"type", "name", "gateway" (its
// link address), "owner" (required: it goes with that link), "pid"}.
net::HttpResponse Head::host_actor(const json& body) {
  if (!body.is_object()) return control::error_reply(400, "a hosted actor is a JSON object");
  SpawnSpec spec;
  spec.type = field<std::string>(body, "type");
  spec.name = field<std::string>(body, "name", std::string());
  spec.owner = field<std::uint64_t>(body, "owner");
  const auto gateway = field<std::string>(body, "gateway");
  const auto pid = field<std::int64_t>(body, "pid", std::int64_t{0});
  if (spec.type.empty()) return control::error_reply(400, "a hosted actor needs its type");
  try {
    (void)net::split_address(gateway);
  } catch (const std::invalid_argument& e) {
    return control::error_reply(400, std::string("bad gateway: ") + e.what());
  }
  std::lock_guard lk(mu_);
  if (spec.owner == 0 || !owner_linked(spec.owner)) {
    return control::error_reply(409, "owner " + std::to_string(spec.owner) + " is not connected");
  }
  const ActorRecord* a = state_->host_actor(std::move(spec), gateway, pid);
  changed();
  return reply(200, json{{"actor_id", a->id}, {"state", std::string(to_string(a->state))}});
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
  const auto owner = field<std::uint64_t>(body, "owner", 0);
  std::lock_guard lk(mu_);
  if (!owner_linked(owner)) return control::error_reply(409, "owner " + std::to_string(owner) + " is not connected");
  auto created = state_->create_group(std::move(spec), owner);
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

// ---- nodes ----

// GET /nodes/{id}[?wait_ms=N] (answered when its drain state changes, or at N);
// POST /nodes/{id}/drain {"deadline_s": 30}.
net::HttpResponse Head::route_node(const net::HttpRequest& req, const std::string& rest) {
  auto [id, verb] = split_id(rest);
  if (id == 0) return control::error_reply(404, "bad node id");
  if (verb.empty() && req.method == "GET") {
    const auto wait = std::chrono::milliseconds(wait_ms_of(req));
    std::unique_lock lk(mu_);
    const auto* n = state_->nodes().find(id);
    if (n == nullptr) return control::error_reply(404, "unknown node " + std::to_string(id));
    const auto drain = n->rec.drain;
    const auto state = n->rec.state;
    cv_.wait_for(lk, wait, [&] {
      const auto* now = state_->nodes().find(id);
      return stopping_ || now->rec.drain != drain || now->rec.state != state;
    });
    return reply(200, node_json(id));
  }
  if (verb == "drain" && req.method == "POST") {
    const json body = parse_request(req.body);
    if (!body.is_object()) return control::error_reply(400, "a drain request is a JSON object");
    const auto deadline = field<double>(body, "deadline_s", 30.0);
    if (deadline < 0 || deadline > 86400) return control::error_reply(400, "deadline_s must be 0 to 86400");
    std::lock_guard lk(mu_);
    auto drained = state_->drain_node(id, std::chrono::milliseconds(std::int64_t(deadline * 1000)));
    if (!drained.ok()) return error_reply(drained.error());
    changed();
    return reply(200, node_json(id));
  }
  return control::error_reply(404, "no such node endpoint");
}

// ---- elastic groups ----

// {"name", "min", "max", "member": a spawn request (its "owner" and "job" are the group's)}.
net::HttpResponse Head::create_elastic(const json& body) {
  if (!body.is_object()) return control::error_reply(400, "an elastic group request is a JSON object");
  ElasticGroupRecord g;
  g.name = field<std::string>(body, "name", std::string());
  g.min = field<std::int64_t>(body, "min", std::int64_t{1});
  g.max = field<std::int64_t>(body, "max", g.min);
  auto member = body.find("member");
  if (member == body.end()) return control::error_reply(400, "missing field 'member'");
  auto spec = SpawnSpec::from_json(*member);
  if (!spec.ok()) return error_reply(spec.error());
  if (spec->colocate_with != 0 || spec->placement_group != 0) {
    return control::error_reply(400, "an elastic group's members are placed one by one: no colocate_with or placement group");
  }
  if (g.name.empty()) g.name = spec->name.empty() ? spec->type : spec->name;
  g.owner = spec->owner;
  g.job = spec->job;
  g.member = std::move(*spec);
  std::lock_guard lk(mu_);
  if (!owner_linked(g.owner)) return control::error_reply(409, "owner " + std::to_string(g.owner) + " is not connected");
  auto created = state_->create_elastic(std::move(g));
  if (!created.ok()) return error_reply(created.error());
  changed();
  return reply(200, elastic_json(**created));
}

net::HttpResponse Head::route_elastic(const net::HttpRequest& req, const std::string& rest) {
  auto [id, verb] = split_id(rest);
  if (id == 0) return control::error_reply(404, "bad elastic group id");
  std::lock_guard lk(mu_);
  auto it = state_->elastic_groups().find(id);
  if (it == state_->elastic_groups().end()) return control::error_reply(404, "unknown elastic group " + std::to_string(id));
  if (verb.empty() && req.method == "GET") return reply(200, elastic_json(it->second));
  if (verb.empty() && req.method == "DELETE") {
    auto removed = state_->remove_elastic(id);
    if (!removed.ok()) return error_reply(removed.error());
    changed();
    return reply(200, json{{"id", id}, {"stopped", *removed}});
  }
  if (verb == "scale" && req.method == "POST") return scale_elastic(id, parse_request(req.body));
  return control::error_reply(404, "no such elastic group endpoint");
}

// {"replicas": N} sets the target; {"min": A, "max": B} the bounds (either or both).
net::HttpResponse Head::scale_elastic(std::uint64_t id, const json& body) {
  if (!body.is_object()) return control::error_reply(400, "a scale request is a JSON object");
  std::optional<std::int64_t> target, min, max;
  if (body.contains("replicas")) target = field<std::int64_t>(body, "replicas");
  if (body.contains("min")) min = field<std::int64_t>(body, "min");
  if (body.contains("max")) max = field<std::int64_t>(body, "max");
  if (!target && !min && !max) return control::error_reply(400, "give replicas, or min and max");
  auto scaled = state_->scale_elastic(id, target, min, max);
  if (!scaled.ok()) return error_reply(scaled.error());
  changed();
  return reply(200, elastic_json(**scaled));
}

json Head::elastic_json(const ElasticGroupRecord& g) const {
  return json{{"id", g.id}, {"name", g.name}, {"min", g.min}, {"max", g.max}, {"target", g.target},
              {"live", state_->elastic_live(g)}, {"members", g.members}, {"owner", g.owner}, {"job", g.job},
              {"type", g.member.type}, {"resources", g.member.resources.to_string()}, {"reason", state_->elastic_reason(g)}};
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
  json elastic = json::array();
  for (const auto& [id, g] : state_->elastic_groups()) elastic.push_back(elastic_json(g));
  return reply(200, json{{"head", address()}, {"link", link_address_}, {"session_dir", config_.session_dir},
                         {"logs", (std::filesystem::path(config_.session_dir) / "logs").string()},
                         {"nodes", nodes}, {"actors", actors}, {"placement_groups", groups}, {"elastic_groups", elastic}});
}

// "node" and "worker" are numbers, 0 while the actor has none.
json Head::actor_json(const ActorRecord& a) const {
  return json{{"id", a.id}, {"label", actor_label(a.spec.name.empty() ? a.spec.type : a.spec.name, a.id)},
              {"type", a.spec.type}, {"name", a.spec.name}, {"state", std::string(to_string(a.state))},
              {"node", a.node}, {"worker", a.worker}, {"pid", a.pid}, {"gateway", a.gateway},
              {"incarnation", a.incarnation}, {"restarts", a.restarts}, {"max_restarts", a.spec.max_restarts},
              {"resources", a.spec.resources.to_string()}, {"reason", a.reason}, {"owner", a.spec.owner},
              {"elastic_group", a.spec.elastic_group}, {"leaving", a.leaving}};
}

json Head::node_json(std::uint64_t id) {
  const auto* n = state_->nodes().find(id);
  auto available = state_->available(id);
  auto seen = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - n->last_seen);
  return json{{"id", id}, {"address", n->rec.address}, {"hostname", n->rec.hostname},
              {"state", std::string(to_string(n->rec.state))}, {"resources", n->rec.total.to_string()},
              {"available", available ? available->to_string() : std::string()}, {"pid", n->rec.pid},
              {"last_seen_ms_ago", seen.count()}, {"registered_ms", n->rec.registered_ms},
              {"drain", n->rec.drain == NodeDrain::None ? "none" : n->rec.drain == NodeDrain::Draining ? "draining" : "drained"},
              {"drain_left", n->rec.drain_left}};
}

json Head::group_json(const placement::GroupView& g) const {
  json bundles = json::array();
  for (std::size_t i = 0; i < g.bundles.size(); ++i) {
    bundles.push_back(json{{"resources", g.bundles[i].to_string()},
                           {"node", g.bundle_nodes[i] ? json(*g.bundle_nodes[i]) : json(nullptr)},
                           {"available", g.bundle_available[i].to_string()}});
  }
  const GroupRecord* rec = state_->groups().find(g.id);
  return json{{"id", g.id}, {"name", g.name}, {"strategy", std::string(placement::to_string(g.strategy))},
              {"state", std::string(placement::to_string(g.state))}, {"bundles", bundles}, {"actors", g.actors},
              {"owner", rec != nullptr ? rec->owner : 0}};
}

// ---- failure detection ----

// A node with an open link is watched by its link (its end, or its silence, is the node's
// death). Only nodes without one (loaded from the store, their daemons not back) have a deadline
// here; with none, this waits for the next change and wakes for nothing else.
void Head::detector_loop() {
  std::unique_lock lk(mu_);
  while (!stopping_) {
    std::set<std::uint64_t> linked;
    for (const auto& [l, peer] : peers_) {
      if (peer.role == Peer::Role::Node && !peer.link->closed() && state_->node_seen(peer.id).ok()) linked.insert(peer.id);
    }
    bool moved = state_->expire_nodes(config_.node_timeout);
    moved = state_->advance_drains(std::chrono::steady_clock::now()) || moved;
    if (moved) changed();
    std::optional<SteadyTime> next = state_->next_drain_time();
    for (const auto& [id, n] : state_->nodes().all()) {
      if (n.rec.state != NodeState::Alive || linked.contains(id)) continue;
      const auto due = n.last_seen + config_.node_timeout + std::chrono::milliseconds(1);
      if (!next || due < *next) next = due;
    }
    if (next) cv_.wait_until(lk, *next);
    else cv_.wait(lk);
  }
}

void Head::changed() {
  ++version_;
  push();
  push_directory();
  for (auto id : state_->take_ended_jobs()) logs_->close(id);   // its followers finish
  cv_.notify_all();
}

// ---- links ----

bool Head::owner_linked(std::uint64_t owner) const {
  if (owner == 0) return true;   // detached: nobody's
  return std::any_of(peers_.begin(), peers_.end(), [&](const auto& p) { return p.second.owner == owner; });
}

void Head::on_link(const std::shared_ptr<net::Link>& link) {
  {
    std::lock_guard lk(mu_);
    peers_[link.get()] = Peer{Peer::Role::Unknown, 0, 0, false, link};
  }
  link->set_handlers([this](net::Link& l, char kind, std::vector<char>& body) { on_link_message(l, kind, body); },
                     [this](net::Link& l, net::LinkEnd end, const std::string& why) { on_link_closed(l, end, why); });
}

void Head::on_link_message(net::Link& link, char kind, std::vector<char>& body) {
  if (kind == net::head_kind::kLog) return on_log(link, body);
  json msg;
  try {
    msg = net::decode_control(body);
  } catch (const std::exception& e) {
    spdlog::warn("head: closing the link from {} ({}): {}", link.address(), link.peer().role, e.what());
    link.close(e.what());
    return;
  }
  std::lock_guard lk(mu_);
  auto it = peers_.find(&link);
  if (it == peers_.end() || stopping_) return;
  Peer& peer = it->second;
  try {
    if (kind == net::head_kind::kHello) hello(peer, msg);
    else if (peer.role != Peer::Role::Unknown && kind == net::head_kind::kEvents) events(peer, msg);
    else throw ErrorException(Error{ControlCode::BadRequest, std::string("unexpected message kind '") + kind + "'"});
  } catch (const ErrorException& e) {   // a bad message closes its link, nothing else
    spdlog::warn("head: closing the link from {} ({}): {}", link.address(), link.peer().role, e.error().message);
    if (kind == net::head_kind::kHello) link.send(net::head_kind::kWelcome, net::encode_control(json{{"error", e.error().message}}));
    link.close(e.error().message);
    return;
  } catch (const json::exception& e) {
    spdlog::warn("head: closing the link from {}: {}", link.address(), e.what());
    link.close(e.what());
    return;
  }
  changed();
}

void Head::hello(Peer& peer, const json& body) {
  const auto role = field<std::string>(body, "role");
  if (peer.role != Peer::Role::Unknown && !(peer.role == Peer::Role::Driver && role == "worker")) {
    throw ErrorException(Error{ControlCode::BadRequest, "this link has said hello already"});
  }
  json welcome;
  if (role == "node") {
    NodeRecord rec;
    const auto resources = field<std::string>(body, "resources");
    auto total = placement::Resources::parse(resources);
    if (!total.ok()) throw ErrorException(Error{ControlCode::BadRequest, "bad resources '" + resources + "': " + total.error().message});
    rec.total = *total;
    rec.address = body.value("address", "127.0.0.1");
    rec.hostname = body.value("hostname", "");
    rec.pid = body.value("pid", std::int64_t{0});
    auto id = state_->register_node(std::move(rec));
    if (!id.ok()) throw ErrorException(id.error());
    peer.role = Peer::Role::Node;
    peer.id = *id;
    welcome = json{{"node_id", *id}, {"session_dir", config_.session_dir}};
  } else if (role == "worker") {
    const auto id = field<std::uint64_t>(body, "worker_id");
    auto state = state_->worker_ready(id, field<std::string>(body, "gateway"), body.value("pid", std::int64_t{0}));
    if (!state.ok()) throw ErrorException(state.error());
    if (*state == WorkerState::Dead) throw ErrorException(Error{ControlCode::Conflict, "worker " + std::to_string(id) + " was retired"});
    peer.role = Peer::Role::Worker;
    peer.id = id;
    welcome = json{{"state", std::string(to_string(*state))}};
  } else if (role == "driver") {
    // A job's driver (TROUPE_JOB_ID and TROUPE_JOB_ATTEMPT in its environment) joins as its job's
    // current attempt, and what it creates is the attempt's; any other driver is a job of its own.
    const auto job = field<std::uint64_t>(body, "job", 0);
    std::uint64_t owner = 0;
    if (job != 0) {
      auto connected = state_->driver_connected(job, field<std::int64_t>(body, "attempt", 0), body.value("pid", std::int64_t{0}));
      if (!connected.ok()) throw ErrorException(connected.error());
      owner = *connected;
    }
    peer.role = Peer::Role::Driver;
    peer.directory = true;
    peer.job = job;
    peer.owner = job != 0 ? owner : state_->new_owner();
    // Its process, when it runs on this host (the link's handshake named it): watched by its pid.
    const auto& who = peer.link->peer();
    if (who.pid != 0 && pid_t(who.pid) != ::getpid() && who.host == links_->self().host) {
      peer.pidfd = int(::syscall(SYS_pidfd_open, pid_t(who.pid), 0));
      if (peer.pidfd >= 0) wake_owner_watch();
    }
    welcome = json{{"version", version_}, {"owner", peer.owner}};
  } else {
    throw ErrorException(Error{ControlCode::BadRequest, "unknown role '" + role + "'"});
  }
  peer.link->send(net::head_kind::kWelcome, net::encode_control(welcome));
}

void Head::events(Peer& peer, const json& body) {
  const json& list = events_of(body);
  if (peer.role == Peer::Role::Node) {
    for (const auto& e : list) {
      if (!e.is_object()) continue;
      const std::string kind = e.value("kind", "");
      if (kind.rfind("driver_", 0) == 0) job_events(peer.id, e);
      if (kind != "worker_exited") continue;
      auto st = state_->worker_exited(peer.id, field<std::uint64_t>(e, "worker_id"), e.value("status", std::string("?")));
      if (!st.ok()) throw ErrorException(st.error());
    }
  } else if (peer.role == Peer::Role::Worker) {
    std::vector<ActorEvent> events;
    for (const auto& e : list) {
      if (!e.is_object()) throw ErrorException(Error{ControlCode::BadRequest, "an event is a JSON object"});
      ActorEvent ev;
      ev.actor = field<std::uint64_t>(e, "actor_id");
      ev.incarnation = e.value("incarnation", std::uint64_t{0});
      const std::string kind = e.value("kind", "");
      ev.kind = kind == "actor_ready" ? ActorEvent::Kind::Ready
                : kind == "actor_drained" ? ActorEvent::Kind::Drained : ActorEvent::Kind::Failed;
      ev.reason = e.value("reason", std::string());
      events.push_back(std::move(ev));
    }
    auto st = state_->actor_events(peer.id, events);
    if (!st.ok()) throw ErrorException(st.error());
  }
}

void Head::on_link_closed(net::Link& link, net::LinkEnd end, const std::string& why) {
  std::lock_guard lk(mu_);
  auto it = peers_.find(&link);
  if (it == peers_.end()) return;
  const Peer peer = it->second;
  peers_.erase(it);
  if (peer.pidfd >= 0) {
    ::close(peer.pidfd);
    wake_owner_watch();
  }
  // Closed here too: a node or worker already retired (nothing changes then), or one whose link
  // sent a bad message (it is lost like any other).
  (void)end;
  if (stopping_) return;
  if (peer.owner != 0) {   // a driver (or a worker process, for what it spawned) is gone: JOB-1
    (void)state_->owner_gone(peer.owner, "its owner's link ended (" + why + ")");
  }
  if (peer.role == Peer::Role::Node) {
    (void)state_->node_gone(peer.id, "its daemon's link ended: " + why);
  } else if (peer.role == Peer::Role::Worker) {
    // Its process is gone, frozen, or cut off from the head: no order reaches it any more. Its
    // node's daemon is told to kill it; its actors restart elsewhere (or are buried).
    if (auto* w = state_->workers().find(peer.id); w != nullptr) {
      (void)state_->worker_exited(w->node, peer.id, "its link ended: " + why);
    }
  }
  changed();
}

void Head::wake_owner_watch() {
  if (owner_wake_ < 0) return;
  const std::uint64_t one = 1;
  (void)!::write(owner_wake_, &one, sizeof one);
}

// Waits on the owners' pidfds and the wake eventfd: no clock. A process that exited ends what it
// owns at once, as its link's end would.
void Head::owner_watch_loop() {
  for (;;) {
    std::vector<pollfd> fds{{owner_wake_, POLLIN, 0}};
    {
      std::lock_guard lk(mu_);
      if (stopping_) return;
      for (const auto& [l, peer] : peers_) {
        if (peer.pidfd >= 0) fds.push_back({peer.pidfd, POLLIN, 0});
      }
    }
    if (::poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      spdlog::error("head: the owners' watch stops: poll: {}", std::strerror(errno));
      return;
    }
    if (fds[0].revents & POLLIN) {
      std::uint64_t n = 0;
      (void)!::read(owner_wake_, &n, sizeof n);
    }
    std::lock_guard lk(mu_);
    if (stopping_) return;
    bool any = false;
    for (std::size_t i = 1; i < fds.size(); ++i) {
      if (!(fds[i].revents & (POLLIN | POLLHUP))) continue;
      for (auto& [l, peer] : peers_) {
        if (peer.pidfd != fds[i].fd) continue;
        ::close(peer.pidfd);
        peer.pidfd = -1;
        if (!net::peer_exited(peer.link->peer())) {   // /proc disagrees: leave it to its link
          spdlog::warn("head: the pidfd of {} ({}) said it exited; /proc does not", peer.link->address(),
                       peer.link->peer().role);
          continue;
        }
        if (peer.owner != 0) {
          (void)state_->owner_gone(peer.owner, "its owner's process exited");
          peer.owner = 0;   // done: the link's end, when it comes, has nothing left to end
          any = true;
        }
        peer.link->close("its process exited");
      }
    }
    if (any) changed();
  }
}

void Head::push() {
  // An order that cannot be encoded (over kMaxControlMessage: the API refuses such specs, so only a
  // bug gets here) is logged and dropped, not thrown out of the link loop that called this.
  auto send = [](Peer& peer, const auto& command) {
    try {
      peer.link->send(net::head_kind::kOrder, net::encode_control(command.to_json()));
    } catch (const std::exception& e) {
      spdlog::error("head: an order to {} {} was dropped: {}", peer.role == Peer::Role::Node ? "node" : "worker", peer.id, e.what());
    }
  };
  for (auto& [l, peer] : peers_) {
    if (peer.link->closed()) continue;
    if (peer.role == Peer::Role::Node) {
      for (const auto& c : state_->take_node_commands(peer.id)) send(peer, c);
      const auto* n = state_->nodes().find(peer.id);
      if (n == nullptr || n->rec.state == NodeState::Dead) peer.link->close("the head declared this node dead");   // FT-3
    } else if (peer.role == Peer::Role::Worker) {
      for (const auto& c : state_->take_worker_commands(peer.id)) send(peer, c);
      auto state = state_->worker_state(peer.id);
      if (!state.ok() || *state == WorkerState::Dead) peer.link->close("the head retired this worker");
    }
  }
}

void Head::push_directory() {
  const auto changed = state_->actors().take_changed();   // taken even with no driver to tell
  const bool any_driver = std::any_of(peers_.begin(), peers_.end(), [](const auto& p) { return p.second.directory; });
  json actors = json::array();
  for (auto id : any_driver ? changed : std::set<std::uint64_t>{}) {
    if (const ActorRecord* a = state_->actor(id)) actors.push_back(actor_json(*a));
  }
  // Placement groups whose state changed since the last push, removed ones as REMOVED: what
  // PlacementGroup::ready_future waits on. Groups are few: comparing them all costs nothing.
  json groups = json::array();
  std::map<std::uint64_t, std::string> now;
  for (const auto& [gid, rec] : state_->groups().all()) {
    if (auto g = state_->group(gid)) now[gid] = std::string(placement::to_string(g->state));
  }
  for (const auto& [gid, st] : now) {
    if (auto it = pushed_groups_.find(gid); it == pushed_groups_.end() || it->second != st) {
      groups.push_back(json{{"id", gid}, {"state", st}});
    }
  }
  for (const auto& [gid, st] : pushed_groups_) {
    if (!now.contains(gid)) groups.push_back(json{{"id", gid}, {"state", "REMOVED"}});
  }
  pushed_groups_ = std::move(now);
  if ((actors.empty() && groups.empty()) || !any_driver) return;
  const auto body = net::encode_control(json{{"version", version_}, {"actors", actors}, {"groups", groups}});
  for (auto& [l, peer] : peers_) {
    if (peer.directory && !peer.link->closed()) peer.link->send(net::head_kind::kDirectory, body);
  }
}

}  // namespace troupe::control
