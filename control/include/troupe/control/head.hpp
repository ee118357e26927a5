// The head: the cluster's directory of nodes, workers and actors, its failure detector, and the
// HTTP API that daemons, workers, drivers and the CLI call (every call needs the cluster token,
// SEC-1). State lives in memory and is written through to the Store (SQLite, WAL).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "troupe/net/http.hpp"
#include "troupe/control/store.hpp"
#include "troupe/placement/scheduler.hpp"

namespace troupe::control {

// JSON replies of the head's API: a body, or {"error": message}.
inline net::HttpResponse reply(int status, const nlohmann::json& body) { return net::HttpResponse{status, body.dump()}; }
inline net::HttpResponse error_reply(int status, const std::string& message) {
  return reply(status, nlohmann::json{{"error", message}});
}

struct HeadConfig {
  std::string bind = "127.0.0.1";
  std::uint16_t port = 0;                              // 0: any free port
  std::string token;                                   // required; never empty
  std::string session_dir;                             // holds store.db
  std::chrono::milliseconds node_timeout{2500};        // no poll for this long: the node is dead
  std::chrono::milliseconds poll_hold{500};            // longest a poll waits for commands
};

class Head {
 public:
  explicit Head(HeadConfig config);   // throws on a port it cannot bind or a store it cannot open
  ~Head();                            // stop()
  Head(const Head&) = delete;
  Head& operator=(const Head&) = delete;

  std::uint16_t port() const { return server_->port(); }
  std::string address() const { return config_.bind + ":" + std::to_string(port()); }
  void stop();

 private:
  struct Worker {
    std::uint64_t id = 0;
    std::uint64_t node = 0;
    std::string state = "starting";                   // starting | alive | dead
    std::string gateway;
    std::int64_t pid = 0;
    std::set<std::uint64_t> actors;
    std::deque<nlohmann::json> commands;
  };
  struct Node {
    NodeRow row;
    std::deque<nlohmann::json> commands;
    std::chrono::steady_clock::time_point last_seen;
  };

  net::HttpResponse route(const net::HttpRequest& req);
  net::HttpResponse route_node(const net::HttpRequest& req, const std::string& rest);
  net::HttpResponse route_worker(const net::HttpRequest& req, const std::string& rest);
  net::HttpResponse route_actor(const net::HttpRequest& req, const std::string& rest);
  net::HttpResponse route_group(const net::HttpRequest& req, const std::string& rest);

  // Node handlers.
  net::HttpResponse register_node(const nlohmann::json& body);
  net::HttpResponse poll_node(std::uint64_t id);
  net::HttpResponse node_events(std::uint64_t id, const nlohmann::json& body);
  // Worker handlers.
  net::HttpResponse worker_ready(std::uint64_t id, const nlohmann::json& body);
  net::HttpResponse poll_worker(std::uint64_t id);
  net::HttpResponse worker_events(std::uint64_t id, const nlohmann::json& body);
  // Actor and directory handlers.
  net::HttpResponse create_actor(const nlohmann::json& body);
  net::HttpResponse kill_actor(std::uint64_t id, const std::string& reason);
  net::HttpResponse get_actor(std::uint64_t id);
  net::HttpResponse directory(const net::HttpRequest& req);
  net::HttpResponse status();
  // Placement groups (head_groups.cpp).
  net::HttpResponse create_group(const nlohmann::json& body);
  net::HttpResponse get_group(std::uint64_t id, std::chrono::milliseconds wait);
  net::HttpResponse remove_group(std::uint64_t id);
  nlohmann::json group_json(const placement::GroupView& g) const;
  void after_release();   // resources came free: pending groups, then pending actors, get a chance

  // State transitions; mu_ held.
  void place_and_start(ActorRow& actor, std::uint64_t colocate_with);
  Worker* worker_for(const placement::Placement& p, const std::string& binary);
  Worker& new_worker(std::uint64_t node, const std::string& binary);
  void start_on_worker(Worker& w, ActorRow& actor);
  void on_worker_lost(Worker& w, const std::string& why);
  // Marks the actor dead for `why`, frees its resources and stops it in its worker (which
  // exits once it hosts nothing).
  void bury(ActorRow& actor, const std::string& why);
  void restart_or_bury(ActorRow& actor, const std::string& why, std::map<std::uint64_t, Worker*>& regroup);
  void on_node_dead(Node& n, const std::string& why);
  void save(const ActorRow& a);
  void save(const NodeRow& n);
  void changed();   // bumps the directory version and wakes every long poll
  nlohmann::json actor_json(const ActorRow& a) const;
  nlohmann::json node_json(const Node& n) const;

  void detector_loop();

  HeadConfig config_;
  std::unique_ptr<Store> store_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::uint64_t version_ = 1;
  std::uint64_t next_node_ = 1, next_worker_ = 1, next_actor_ = 1;
  std::map<std::uint64_t, Node> nodes_;
  std::map<std::uint64_t, Worker> workers_;
  std::map<std::uint64_t, ActorRow> actors_;
  std::map<std::uint64_t, std::uint64_t> process_workers_;   // placement's colocation key -> worker
  placement::Scheduler scheduler_;
  std::thread detector_;
  std::unique_ptr<net::HttpServer> server_;   // last: it calls into everything above
};

}  // namespace troupe::control
