// A cluster of real processes for one test: a head and node daemons started through the `troupe`
// CLI in a private temp dir, on a free port. The destructor stops everything it started (CLI
// stop, then SIGKILL of anything left), so no test leaves a process behind.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <thread>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "troupe/runtime.hpp"

namespace itest {

struct CommandResult {
  int status = -1;       // exit status, or -1 if it timed out (and was killed)
  std::string output;    // stdout and stderr
};

// Set once an assertion of the running test has failed (integration_main.cpp's listener): a
// Cluster destroyed then prints the tail of each daemon's log and its threads' stacks to stderr.
inline bool test_failed = false;

// A driver runtime joined to `c`, with the given deadline for calls to worker actors.
class Cluster;
troupe::Runtime connect(const Cluster& c, std::chrono::seconds call_timeout);

// Starts this test binary again as helper `name` with `arg` (support/helper_main.hpp); the
// helper's stdout comes back on *out (its stderr is this process's). It dies with this process.
pid_t start_helper(const std::string& name, const std::string& arg, int* out);
// One line from `fd` within `timeout` (empty if none came); all that comes until EOF, for read_all.
std::string read_line(int fd, std::chrono::milliseconds timeout);
std::string read_all(int fd, std::chrono::milliseconds timeout);

// Whether process `pid` has exited (a zombie has, and so has one /proc no longer shows).
bool process_gone(pid_t pid);

// Runs argv with a deadline.
CommandResult run(const std::vector<std::string>& argv, std::chrono::seconds timeout = std::chrono::seconds(30));

class Cluster {
 public:
  // Its daemons are stopped and its files removed by the destructor or, when this process goes
  // without running it (a signal, a crash), by a guard process that outlives it.
  explicit Cluster(const std::string& head_resources = "CPU=2", const std::vector<std::string>& head_flags = {});
  ~Cluster();
  Cluster(const Cluster&) = delete;
  Cluster& operator=(const Cluster&) = delete;

  // Starts a node daemon; returns its pid (from its pid file).
  pid_t add_node(const std::string& resources, const std::vector<std::string>& flags = {});
  nlohmann::json status() const;             // troupe status --json
  const std::string& address() const { return address_; }
  const std::string& token() const { return token_; }
  const std::string& temp_dir() const { return dir_; }
  std::string cli(const std::vector<std::string>& args, int* status = nullptr,
                  std::chrono::seconds timeout = std::chrono::seconds(30)) const;
  // `troupe job ARGS...` against this cluster (its address and token).
  CommandResult job(const std::vector<std::string>& args, std::chrono::seconds timeout = std::chrono::seconds(60)) const;

  // Polls status until pred(status) holds or `timeout` passes; returns whether it held.
  template <class Pred>
  bool wait_until(Pred pred, std::chrono::milliseconds timeout) const;

  nlohmann::json node(int id) const;
  nlohmann::json actor(std::uint64_t id) const;
  std::vector<pid_t> daemon_pids() const;   // the head's process and every node daemon's
  void print_logs(std::size_t tail_lines) const;   // each daemon's log, its last lines, to stderr
  void print_stacks() const;   // each daemon's threads' backtraces (gdb), to stderr

 private:
  std::string dir_, address_, token_;
  int guard_ = -1;   // the write end of its guard's pipe
};

template <class Pred>
bool Cluster::wait_until(Pred pred, std::chrono::milliseconds timeout) const {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred(status())) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return pred(status());
}

}  // namespace itest
