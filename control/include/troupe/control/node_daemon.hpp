// The node daemon: holds a link to the head (net/head_link.hpp: its hello registers the node, its
// heartbeats keep it alive), starts and stops the worker processes and job drivers the head
// orders, and reports their exits. One per machine, or embedded in a driver that runs without a
// cluster. When its link to the head ends (the head declared the node dead, FT-3, or is gone) it
// stops its workers and drivers.
//
// Jobs: a job's driver and its worker processes run from the job's directory on this node
// (<work_dir>/jobs/<job id>), its package (fetched from the head once into the node's bounded
// cache, checked against its digest, unpacked there) or an empty one; their output goes to the
// head as it comes (and to a local file), so the job's logs survive this node. A driver leads a
// process group of its own: stopping a job signals the whole group. Fetching and unpacking run on
// a thread of their own, so orders (kills, stops) are never held behind a download.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "troupe/net/head_link.hpp"
#include "troupe/net/link.hpp"

namespace troupe::control {

class PackageCache;

struct DaemonConfig {
  std::string head_host = "127.0.0.1";
  std::uint16_t head_port = 0;
  std::string token;
  std::string resources;             // "CPU=2,memory=8G"; empty: detect cores and memory
  std::string advertise = "127.0.0.1";  // address workers bind their gateways to
  std::string session_dir;           // logs/ goes under it
  std::string work_dir;              // jobs/ (each job's directory); "": <session_dir>/node-<pid>
  std::string cache_dir;             // fetched packages; "": <work_dir>/packages
  std::uint64_t cache_bytes = std::uint64_t(10) << 30;   // the package cache's cap (LRU past it)
  std::uint64_t max_package_bytes = std::uint64_t(1) << 30;   // a download larger than this is refused
  // A job process's output kept in this node's copy (its driver-<attempt>.log, a worker's log), at
  // most: past it the copy ends with a line saying so (0: only that line). The head's copy has its
  // own cap (HeadConfig::job_log_bytes), and forwarding to it goes on.
  std::uint64_t local_log_bytes = std::uint64_t(64) << 20;
};

class NodeDaemon {
 public:
  explicit NodeDaemon(DaemonConfig config);
  ~NodeDaemon();   // stop()
  NodeDaemon(const NodeDaemon&) = delete;
  NodeDaemon& operator=(const NodeDaemon&) = delete;

  // Registers and starts the order, starter and reaper threads. Throws std::runtime_error if the
  // head refuses (e.g. wrong token, bad resources) or cannot be reached within `timeout`.
  void start(std::chrono::milliseconds timeout);
  // Closes the link to the head and terminates every worker and driver. Idempotent.
  void stop();
  // True once the daemon has stopped by itself (its link to the head ended).
  bool finished() const { return finished_; }
  std::uint64_t node_id() const { return node_id_; }
  const DaemonConfig& config() const { return config_; }

  // "CPU=<cores>,memory=<physical bytes>" for this machine.
  static std::string detect_resources();

 private:
  // A child's stdout and stderr, read from a pipe by the reaper and forwarded.
  struct Output {
    std::uint64_t job = 0;
    std::uint64_t worker = 0;        // 0: the job's driver
    std::string local_log;           // a copy on this node, at most DaemonConfig::local_log_bytes
    std::uint64_t kept = 0;          // bytes in local_log
    bool capped = false;             // the copy has ended (its last line says so)
    std::string partial;             // a worker's line not yet ended
  };
  struct Driver {
    std::uint64_t job = 0;
    std::int64_t attempt = 0;
    pid_t pid = 0;                   // and its process group
    int output = -1;                 // the read end of its pipe, -1 once at EOF
    std::optional<std::chrono::steady_clock::time_point> kill_at;   // stopping: SIGKILL the group then
  };
  // What the starter thread does: a driver, or a job's worker (both may need the package).
  struct Launch {
    nlohmann::json command;
  };

  void order_loop();
  void reap_loop();
  void start_loop();
  void wake();                      // the reaper looks again now
  void forget_pidfd(pid_t pid);     // mu_ held
  void run(const nlohmann::json& command);
  void start_worker(std::uint64_t worker_id, const std::string& binary, const nlohmann::json& command);
  void kill_worker(std::uint64_t worker_id);
  void start_driver(const nlohmann::json& command);
  void stop_driver(std::uint64_t job, std::int64_t attempt, std::int64_t grace_ms);
  // The job's directory on this node, its package fetched and unpacked there; throws
  // std::runtime_error naming what failed. `progress` is told each slow step.
  std::string prepare_job_dir(std::uint64_t job, const std::string& package,
                              const std::function<void(const std::string&)>& progress);
  void keep_local(Output& o, const char* bytes, std::size_t n);   // the copy on this node, capped
  int open_output(std::uint64_t job, std::uint64_t worker, const std::string& local_log, int* write_end);   // mu_ held
  // Reads what `fd` has; false at EOF. When `drain`, all of it, but only until `until` and while
  // `*budget` bytes are left (counted down): a writer that outlived its driver, in a session of
  // its own, may never stop. mu_ held.
  bool read_output(int fd, bool drain, std::vector<net::LogPiece>& out,
                   std::chrono::steady_clock::time_point until = std::chrono::steady_clock::time_point::max(),
                   std::size_t* budget = nullptr);
  void close_output(int fd, std::vector<net::LogPiece>& out);   // mu_ held
  void send_logs(const std::vector<net::LogPiece>& pieces);
  void report(const nlohmann::json& event);
  std::string head_link(std::chrono::steady_clock::time_point deadline);   // the head's link address

  DaemonConfig config_;
  std::uint64_t node_id_ = 0;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> finished_{false};
  std::mutex mu_;
  std::map<std::uint64_t, pid_t> workers_;   // worker id -> pid, while running
  std::set<std::uint64_t> killed_early_;      // workers killed while their start was still queued
  // Workers sent SIGTERM, by pid: SIGKILLed by the reaper if still alive at the deadline. Kills
  // never block the order loop.
  std::map<pid_t, std::chrono::steady_clock::time_point> terminating_;
  std::map<pid_t, int> pidfds_;     // readable when that child exits
  std::map<int, Output> outputs_;   // by the pipe's read end
  std::map<std::uint64_t, Driver> drivers_;   // by job
  std::set<std::pair<std::uint64_t, std::int64_t>> stopped_early_;   // (job, attempt) stopped before it started
  int wake_fd_ = -1;                // eventfd
  std::unique_ptr<PackageCache> cache_;
  std::mutex start_mu_;
  std::condition_variable start_cv_;
  std::deque<Launch> launches_;     // for the starter thread
  std::unique_ptr<net::LinkHub> hub_;
  std::unique_ptr<net::HeadSession> head_;
  std::thread orders_, reaper_, starter_;
};

}  // namespace troupe::control
