// The head: the cluster's directory of nodes, workers, actors and placement groups, its failure
// detector, and the two doors into it. Troupe processes (node daemons, workers, drivers) hold a
// link to it (net/head_link.hpp): they say who they are once and are then pushed their orders and
// the directory's changes as they happen; a node whose link ends or falls silent is dead. The
// HTTP API serves operators and clients that are no troupe process (CLI, spawn and kill, groups,
// status, jobs and their packages and logs: head_jobs.cpp). Both need the cluster token (SEC-1). The state is HeadState's (typed managers and their
// transitions, in memory, written through to the Store: SQLite, WAL); this class adapts requests
// and link messages to it. A head started on a session directory that holds a store loads it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "troupe/net/http.hpp"
#include "troupe/net/link.hpp"
#include "troupe/control/store.hpp"
#include "troupe/placement/placement_group.hpp"

namespace troupe::control {

// JSON replies of the head's API: a body, or {"error": message}. Text that is not UTF-8 (a path
// a client sent, a file name in its package) goes as U+FFFD, never an exception.
inline net::HttpResponse reply(int status, const nlohmann::json& body) {
  return net::HttpResponse{status, body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)};
}
inline net::HttpResponse error_reply(int status, const std::string& message) {
  return reply(status, nlohmann::json{{"error", message}});
}
// A typed error as the API answers it: BadRequest 400, NotFound 404, Conflict 409, TooLarge 413.
inline net::HttpResponse error_reply(const Error& e) {
  int status = 500;
  if (e.code == ControlCode::BadRequest) status = 400;
  else if (e.code == ControlCode::NotFound) status = 404;
  else if (e.code == ControlCode::Conflict) status = 409;
  else if (e.code == ControlCode::TooLarge) status = 413;
  return error_reply(status, e.message);
}

// A request body as JSON ("": {}): nlohmann::json::parse_error for text that is not JSON, and
// ErrorException BadRequest for JSON nested deeper than net::kMaxJsonDepth (head_link.hpp).
nlohmann::json parse_request(const std::string& body);

class HeadState;
class JobLogs;
class PackageCache;

struct HeadConfig {
  std::string bind = "127.0.0.1";
  std::uint16_t port = 0;                              // 0: any free port
  std::string token;                                   // required; never empty
  std::string session_dir;                             // holds store.db
  std::chrono::milliseconds node_timeout{2500};        // a node's link silent this long: the node is
                                                       // dead (a loaded node: no link this long)
  std::uint64_t max_package_bytes = std::uint64_t(1) << 30;   // a job package's archive, at most
  std::uint64_t package_store_bytes = std::uint64_t(10) << 30;   // all packages; past it the least
                                                              // recently used that no live job names go
  std::uint64_t job_log_bytes = std::uint64_t(64) << 20;      // one job's log, at most
  std::uint64_t job_logs_total_bytes = std::uint64_t(1) << 30;   // all jobs' logs; past it the oldest ended go
};

class Head {
 public:
  explicit Head(HeadConfig config);   // throws on a port it cannot bind or a store it cannot open
  ~Head();                            // stop()
  Head(const Head&) = delete;
  Head& operator=(const Head&) = delete;

  std::uint16_t port() const { return server_->port(); }
  std::string address() const { return config_.bind + ":" + std::to_string(port()); }   // HTTP
  const std::string& link_address() const { return link_address_; }                    // links
  void stop();

 private:
  net::HttpResponse route(const net::HttpRequest& req);
  net::HttpResponse route_actor(const net::HttpRequest& req, const std::string& rest);
  net::HttpResponse route_group(const net::HttpRequest& req, const std::string& rest);
  net::HttpResponse create_actor(const nlohmann::json& body);
  net::HttpResponse host_actor(const nlohmann::json& body);
  net::HttpResponse kill_actor(std::uint64_t id, const std::string& reason);
  net::HttpResponse get_actor(std::uint64_t id);
  net::HttpResponse create_group(const nlohmann::json& body);
  net::HttpResponse get_group(std::uint64_t id, std::chrono::milliseconds wait);
  net::HttpResponse remove_group(std::uint64_t id);
  net::HttpResponse directory(const net::HttpRequest& req);
  net::HttpResponse route_node(const net::HttpRequest& req, const std::string& rest);
  net::HttpResponse create_elastic(const nlohmann::json& body);
  net::HttpResponse route_elastic(const net::HttpRequest& req, const std::string& rest);
  net::HttpResponse scale_elastic(std::uint64_t id, const nlohmann::json& body);   // mu_ held
  nlohmann::json elastic_json(const ElasticGroupRecord& g) const;
  net::HttpResponse status();

  // Jobs and their packages (head_jobs.cpp).
  net::HttpResponse route_jobs(const net::HttpRequest& req, const std::string& rest);
  net::HttpResponse route_package(const net::HttpRequest& req, const std::string& digest);
  net::HttpResponse put_package(const net::HttpRequest& req, const std::string& digest);
  net::HttpResponse submit_job(const nlohmann::json& body);
  net::HttpResponse job_logs(std::uint64_t id, const net::HttpRequest& req);
  nlohmann::json job_json(const JobRecord& j) const;
  std::uint64_t job_id(const std::string& text);   // a number, or a submission id; 0: none; mu_ held
  std::string package_path(const std::string& digest) const;
  void on_log(net::Link& link, std::vector<char>& body);
  void job_events(std::uint64_t node, const nlohmann::json& e);   // a driver_* event of a node; mu_ held

  nlohmann::json actor_json(const ActorRecord& a) const;
  nlohmann::json node_json(std::uint64_t id);
  nlohmann::json group_json(const placement::GroupView& g) const;
  void changed();   // bumps the directory version, pushes what changed, wakes the long polls; mu_ held
  void detector_loop();

  // Links: the first message says who is at the other end; then orders go out and events come in.
  struct Peer {
    enum class Role : std::uint8_t { Unknown, Node, Worker, Driver } role = Role::Unknown;
    std::uint64_t id = 0;                           // the node's or the worker's
    std::uint64_t owner = 0;                        // a driver's: what it creates is owned by it
    bool directory = false;                         // pushed the directory's changes (drivers, and
                                                    // workers whose link said hello as a driver first)
    std::shared_ptr<net::Link> link;
    int pidfd = -1;                                 // an owner's process on this host, watched (owner_watch_loop)
    std::uint64_t job = 0;                          // a job's driver: that job
  };
  void on_link(const std::shared_ptr<net::Link>& link);
  void on_link_message(net::Link& link, char kind, std::vector<char>& body);
  void on_link_closed(net::Link& link, net::LinkEnd end, const std::string& why);
  void hello(Peer& peer, const nlohmann::json& body);
  void events(Peer& peer, const nlohmann::json& body);
  void push();   // every queued order to its linked node or worker; links of the retired closed
  void push_directory();
  bool owner_linked(std::uint64_t owner) const;   // 0, or a driver link's owner that is open; mu_ held
  // An owner on this host is also watched by its pid: its process's exit ends what it owns even if
  // its link were to say nothing (the link's end and its silence are the other two ways).
  void owner_watch_loop();
  void wake_owner_watch();

  HeadConfig config_;
  std::unique_ptr<Store> store_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::uint64_t version_ = 1;
  std::unique_ptr<HeadState> state_;          // the typed head (head_state.hpp); under mu_
  std::unique_ptr<JobLogs> logs_;             // thread-safe on its own
  std::unique_ptr<PackageCache> packages_;    // under mu_
  std::map<const net::Link*, Peer> peers_;    // under mu_
  std::map<std::uint64_t, std::string> pushed_groups_;   // each group's state as last pushed; under mu_
  std::thread detector_;
  int owner_wake_ = -1;   // eventfd: the owners' pidfds changed, or the head stops
  std::thread owner_watch_;
  std::unique_ptr<net::LinkHub> links_;
  std::string link_address_;
  std::unique_ptr<net::HttpServer> server_;   // last: it calls into everything above
};

}  // namespace troupe::control
