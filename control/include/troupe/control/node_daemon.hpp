// The node daemon: holds a link to the head (net/head_link.hpp: its hello registers the node, its
// heartbeats keep it alive), starts and stops the worker processes the head orders, and reports
// their exits. One per machine, or embedded in a driver that runs without a cluster. When its link
// to the head ends (the head declared the node dead, FT-3, or is gone) it stops its workers.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "troupe/net/head_link.hpp"
#include "troupe/net/link.hpp"

namespace troupe::control {

struct DaemonConfig {
  std::string head_host = "127.0.0.1";
  std::uint16_t head_port = 0;
  std::string token;
  std::string resources;             // "CPU=2,memory=8G"; empty: detect cores and memory
  std::string advertise = "127.0.0.1";  // address workers bind their gateways to
  std::string session_dir;           // logs/ goes under it
};

class NodeDaemon {
 public:
  explicit NodeDaemon(DaemonConfig config);
  ~NodeDaemon();   // stop()
  NodeDaemon(const NodeDaemon&) = delete;
  NodeDaemon& operator=(const NodeDaemon&) = delete;

  // Registers and starts the order and reaper threads. Throws std::runtime_error if the head
  // refuses (e.g. wrong token, bad resources) or cannot be reached within `timeout`.
  void start(std::chrono::milliseconds timeout);
  // Closes the link to the head and terminates every worker. Idempotent.
  void stop();
  // True once the daemon has stopped by itself (its link to the head ended).
  bool finished() const { return finished_; }
  std::uint64_t node_id() const { return node_id_; }

  // "CPU=<cores>,memory=<physical bytes>" for this machine.
  static std::string detect_resources();

 private:
  void order_loop();
  void reap_loop();
  void wake();                      // the reaper looks again now
  void forget_pidfd(pid_t pid);     // mu_ held
  void run(const nlohmann::json& command);
  void start_worker(std::uint64_t worker_id, const std::string& binary);
  void kill_worker(std::uint64_t worker_id);
  std::string head_link(std::chrono::steady_clock::time_point deadline);   // the head's link address

  DaemonConfig config_;
  std::uint64_t node_id_ = 0;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> finished_{false};
  std::mutex mu_;
  std::map<std::uint64_t, pid_t> workers_;   // worker id -> pid, while running
  // Workers sent SIGTERM, by pid: SIGKILLed by the reaper if still alive at the deadline. Kills
  // never block the order loop.
  std::map<pid_t, std::chrono::steady_clock::time_point> terminating_;
  std::map<pid_t, int> pidfds_;     // readable when that child exits
  int wake_fd_ = -1;                // eventfd
  std::unique_ptr<net::LinkHub> hub_;
  std::unique_ptr<net::HeadSession> head_;
  std::thread orders_, reaper_;
};

}  // namespace troupe::control
