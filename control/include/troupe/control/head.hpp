// The head: the cluster's directory of nodes, workers, actors and placement groups, its failure
// detector, and the HTTP API that daemons, workers, drivers and the CLI call (every call needs
// the cluster token, SEC-1). The state is HeadState's (typed managers and their transitions, in
// memory, written through to the Store: SQLite, WAL); this class adapts HTTP requests to it and
// holds the long polls. A head started on a session directory that holds a store loads it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "troupe/net/http.hpp"
#include "troupe/control/store.hpp"
#include "troupe/placement/placement_group.hpp"

namespace troupe::control {

// JSON replies of the head's API: a body, or {"error": message}.
inline net::HttpResponse reply(int status, const nlohmann::json& body) { return net::HttpResponse{status, body.dump()}; }
inline net::HttpResponse error_reply(int status, const std::string& message) {
  return reply(status, nlohmann::json{{"error", message}});
}

class HeadState;

struct HeadConfig {
  std::string bind = "127.0.0.1";
  std::uint16_t port = 0;                              // 0: any free port
  std::string token;                                   // required; never empty
  std::string session_dir;                             // holds store.db
  std::chrono::milliseconds node_timeout{2500};        // no poll for this long: the node is dead (a
                                                       // loaded node: none since the head started)
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
  net::HttpResponse route(const net::HttpRequest& req);
  net::HttpResponse route_node(const net::HttpRequest& req, const std::string& rest);
  net::HttpResponse route_worker(const net::HttpRequest& req, const std::string& rest);
  net::HttpResponse route_actor(const net::HttpRequest& req, const std::string& rest);
  net::HttpResponse route_group(const net::HttpRequest& req, const std::string& rest);

  net::HttpResponse register_node(const nlohmann::json& body);
  net::HttpResponse poll_node(std::uint64_t id);
  net::HttpResponse node_events(std::uint64_t id, const nlohmann::json& body);
  net::HttpResponse worker_ready(std::uint64_t id, const nlohmann::json& body);
  net::HttpResponse poll_worker(std::uint64_t id);
  net::HttpResponse worker_events(std::uint64_t id, const nlohmann::json& body);
  net::HttpResponse create_actor(const nlohmann::json& body);
  net::HttpResponse kill_actor(std::uint64_t id, const std::string& reason);
  net::HttpResponse get_actor(std::uint64_t id);
  net::HttpResponse create_group(const nlohmann::json& body);
  net::HttpResponse get_group(std::uint64_t id, std::chrono::milliseconds wait);
  net::HttpResponse remove_group(std::uint64_t id);
  net::HttpResponse directory(const net::HttpRequest& req);
  net::HttpResponse status();

  nlohmann::json actor_json(const ActorRecord& a) const;
  nlohmann::json node_json(std::uint64_t id);
  nlohmann::json group_json(const placement::GroupView& g) const;
  void changed();   // bumps the directory version and wakes every long poll; mu_ held
  void detector_loop();

  HeadConfig config_;
  std::unique_ptr<Store> store_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::uint64_t version_ = 1;
  std::unique_ptr<HeadState> state_;          // the typed head (head_state.hpp); under mu_
  std::thread detector_;
  std::unique_ptr<net::HttpServer> server_;   // last: it calls into everything above
};

}  // namespace troupe::control
