// Starting and reaping child processes (worker processes of a node daemon). The only place
// troupe forks, so a test can see every OS effect of the daemon in one file.
#pragma once

#include <sys/types.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace troupe::control {

struct ProcessSpec {
  std::string binary;
  std::vector<std::string> args;             // argv[1..]
  std::map<std::string, std::string> env;    // added to (or replacing in) the parent's environment
  std::string log_path;                      // stdout and stderr, appended
  bool die_with_parent = true;               // SIGKILL the child if the daemon dies (PR_SET_PDEATHSIG)
};

// Forks and execs. Returns the pid; throws std::runtime_error if the log cannot be opened or
// fork fails. A binary that cannot be executed shows as the child exiting with status 127.
pid_t spawn_process(const ProcessSpec& spec);

// Reaps `pid` if it has exited; returns a description ("exit 0", "signal 9") or nullopt while
// it runs. Never blocks.
std::optional<std::string> try_reap(pid_t pid);

// A descriptor that becomes readable when `pid` exits (pidfd_open), or -1. The caller closes it.
int open_pidfd(pid_t pid);

// SIGTERM, then SIGKILL after `grace_ms` (waiting on its pidfd, not on a clock); reaps it. Safe on
// a pid that already exited.
void terminate_process(pid_t pid, int grace_ms);

}  // namespace troupe::control
