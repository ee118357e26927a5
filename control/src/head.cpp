// The head's HTTP surface, long polls and failure detector. State transitions: head_directory.cpp.
#include "troupe/control/head.hpp"

#include <spdlog/spdlog.h>

#include <filesystem>

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

}  // namespace

Head::Head(HeadConfig config) : config_(std::move(config)) {
  if (config_.token.empty()) throw std::invalid_argument("the head needs a cluster token");
  std::filesystem::create_directories(config_.session_dir);
  store_ = open_sqlite_store((std::filesystem::path(config_.session_dir) / "store.db").string());
  if (auto v = store_->get_meta("next_actor")) next_actor_ = std::stoull(*v);
  store_->put_meta("started_ms", std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(
                                      std::chrono::system_clock::now().time_since_epoch()).count()));
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
    return error_reply(401, "missing or wrong cluster token");
  }
  static const std::string kApi = "/api/v1";
  if (req.path.rfind(kApi, 0) != 0) return error_reply(404, "no such endpoint: " + req.path);
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
    return error_reply(400, std::string("bad request body: ") + e.what());
  } catch (const std::invalid_argument& e) {
    return error_reply(400, e.what());
  }
  return error_reply(404, "no such endpoint: " + req.method + " " + req.path);
}

net::HttpResponse Head::route_node(const net::HttpRequest& req, const std::string& rest) {
  auto [id, verb] = split_id(rest);
  if (id == 0) return error_reply(404, "bad node id");
  if (verb == "poll" && req.method == "POST") return poll_node(id);
  if (verb == "events" && req.method == "POST") return node_events(id, json::parse(req.body));
  return error_reply(404, "no such node endpoint");
}

net::HttpResponse Head::route_worker(const net::HttpRequest& req, const std::string& rest) {
  auto [id, verb] = split_id(rest);
  if (id == 0) return error_reply(404, "bad worker id");
  if (verb == "ready" && req.method == "POST") return worker_ready(id, json::parse(req.body));
  if (verb == "poll" && req.method == "POST") return poll_worker(id);
  if (verb == "events" && req.method == "POST") return worker_events(id, json::parse(req.body));
  return error_reply(404, "no such worker endpoint");
}

net::HttpResponse Head::route_actor(const net::HttpRequest& req, const std::string& rest) {
  auto [id, verb] = split_id(rest);
  if (id == 0) return error_reply(404, "bad actor id");
  if (verb.empty() && req.method == "GET") return get_actor(id);
  if (verb == "kill" && req.method == "POST") {
    auto body = nlohmann::json::parse(req.body.empty() ? "{}" : req.body);
    return kill_actor(id, body.is_object() ? body.value("reason", "was killed") : "was killed");
  }
  return error_reply(404, "no such actor endpoint");
}

net::HttpResponse Head::route_group(const net::HttpRequest& req, const std::string& rest) {
  auto [id, verb] = split_id(rest);
  if (id == 0) return error_reply(404, "bad placement group id");
  if (verb.empty() && req.method == "GET") {
    long wait_ms = 0;
    if (auto it = req.query.find("wait_ms"); it != req.query.end()) {
      try {
        wait_ms = std::clamp(std::stol(it->second), 0L, 5000L);
      } catch (const std::exception&) {
        return error_reply(400, "wait_ms must be a number");
      }
    }
    return get_group(id, std::chrono::milliseconds(wait_ms));
  }
  if (verb == "remove" && req.method == "POST") return remove_group(id);
  return error_reply(404, "no such placement group endpoint");
}

net::HttpResponse Head::poll_node(std::uint64_t id) {
  std::unique_lock lk(mu_);
  auto it = nodes_.find(id);
  if (it == nodes_.end()) return error_reply(404, "unknown node " + std::to_string(id));
  Node& n = it->second;
  if (n.row.state != "alive") return reply(200, json{{"state", "dead"}, {"commands", json::array()}});
  n.last_seen = std::chrono::steady_clock::now();
  cv_.wait_for(lk, config_.poll_hold, [&] { return stopping_ || !n.commands.empty() || n.row.state != "alive"; });
  n.last_seen = std::chrono::steady_clock::now();
  json cmds = json::array();
  while (!n.commands.empty()) { cmds.push_back(std::move(n.commands.front())); n.commands.pop_front(); }
  return reply(200, json{{"state", n.row.state}, {"commands", cmds}});
}

net::HttpResponse Head::poll_worker(std::uint64_t id) {
  std::unique_lock lk(mu_);
  auto it = workers_.find(id);
  if (it == workers_.end()) return error_reply(404, "unknown worker " + std::to_string(id));
  Worker& w = it->second;
  cv_.wait_for(lk, config_.poll_hold, [&] { return stopping_ || !w.commands.empty() || w.state == "dead"; });
  json cmds = json::array();
  while (!w.commands.empty()) { cmds.push_back(std::move(w.commands.front())); w.commands.pop_front(); }
  return reply(200, json{{"state", w.state}, {"commands", cmds}});
}

net::HttpResponse Head::directory(const net::HttpRequest& req) {
  std::uint64_t since = 0;
  long wait_ms = 0;
  try {
    if (auto it = req.query.find("since"); it != req.query.end()) since = std::stoull(it->second);
    if (auto it = req.query.find("wait_ms"); it != req.query.end()) wait_ms = std::clamp(std::stol(it->second), 0L, 5000L);
  } catch (const std::exception&) {
    return error_reply(400, "since and wait_ms must be numbers");
  }
  std::unique_lock lk(mu_);
  cv_.wait_for(lk, std::chrono::milliseconds(wait_ms), [&] { return stopping_ || version_ > since; });
  json actors = json::array();
  for (auto& [aid, a] : actors_) actors.push_back(actor_json(a));
  json nodes = json::array();
  for (auto& [nid, n] : nodes_) nodes.push_back(node_json(n));
  return reply(200, json{{"version", version_}, {"actors", actors}, {"nodes", nodes}});
}

net::HttpResponse Head::status() {
  std::lock_guard lk(mu_);
  json nodes = json::array();
  for (auto& [nid, n] : nodes_) nodes.push_back(node_json(n));
  json actors = json::array();
  for (auto& [aid, a] : actors_) actors.push_back(actor_json(a));
  json groups = json::array();
  for (auto gid : scheduler_.group_ids()) {
    if (auto g = scheduler_.group(gid)) groups.push_back(group_json(*g));
  }
  return reply(200, json{{"head", address()}, {"session_dir", config_.session_dir},
                         {"logs", (std::filesystem::path(config_.session_dir) / "logs").string()},
                         {"nodes", nodes}, {"actors", actors}, {"placement_groups", groups}});
}

void Head::detector_loop() {
  std::unique_lock lk(mu_);
  while (!stopping_) {
    cv_.wait_for(lk, std::chrono::milliseconds(100));
    if (stopping_) break;
    auto now = std::chrono::steady_clock::now();
    for (auto& [id, n] : nodes_) {
      if (n.row.state == "alive" && now - n.last_seen > config_.node_timeout) {
        on_node_dead(n, "missed heartbeats for " + std::to_string(config_.node_timeout.count()) + " ms");
      }
    }
  }
}

void Head::changed() {
  ++version_;
  cv_.notify_all();
}

}  // namespace troupe::control
