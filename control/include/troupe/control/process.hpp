// Starting and reaping child processes (worker processes and job drivers of a node daemon). The
// only place troupe forks, so a test can see every OS effect of the daemon in one file. Every
// child leads a process group of its own (a job's stop signals the whole group) and starts with
// no signal blocked (the daemon blocks its stop signals for sigtimedwait).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace troupe::control {

struct ProcessSpec {
  std::string binary;
  std::vector<std::string> args;             // argv[1..]
  std::map<std::string, std::string> env;    // added to (or replacing in) the parent's environment
  std::string log_path;                      // stdout and stderr, appended (when output_fd < 0)
  int output_fd = -1;                        // else stdout and stderr go here (a pipe's write end)
  std::string cwd;                           // "": the daemon's
  bool search_path = false;                  // a binary without '/' is looked up in PATH
  bool die_with_parent = true;               // SIGKILL the child if the daemon dies (PR_SET_PDEATHSIG)
};

// Forks and execs. Returns the pid (also its process group's id); throws std::runtime_error if the
// log cannot be opened or fork fails. A binary that cannot be executed, or a cwd that cannot be
// entered, shows as the child exiting with status 127.
pid_t spawn_process(const ProcessSpec& spec);

// Reaps `pid` if it has exited; returns a description ("exit 0", "signal 9") or nullopt while
// it runs. Never blocks.
std::optional<std::string> try_reap(pid_t pid);

// A descriptor that becomes readable when `pid` exits (pidfd_open), or -1. The caller closes it.
int open_pidfd(pid_t pid);

// Waits until process `pid` (a child or not) has exited, at most `limit`, on its pidfd: true once
// it is gone. Without pidfd (a kernel before 5.3) it looks every 20 ms (kill(pid, 0)). Does not
// reap a child.
bool wait_exit(pid_t pid, std::chrono::milliseconds limit);

// SIGTERM, then SIGKILL after `grace_ms` (waiting on its pidfd, not on a clock); reaps it. Safe on
// a pid that already exited.
void terminate_process(pid_t pid, int grace_ms);
// The same for a child that leads its own process group (spawn_process's children do): the group
// gets the SIGTERM with it, and a SIGKILL once it has gone (what it started and left running, such
// as a data loader or an inference server holding a GPU).
void terminate_group(pid_t pid, int grace_ms);

// What prefetch_program read: the program's binary, then its ELF interpreter and the shared
// libraries it needs, transitively (canonical paths, each once); and their bytes.
struct Prefetched {
  std::vector<std::string> files;
  std::uint64_t bytes = 0;
};

// Reads a program's files into the page cache before it starts, each whole and in order
// (readahead(2)), so that its start faults nothing in from disk one page at a time. On a VM whose
// disk serves small random reads slowly (2026-12-03: ~80 ms a fault while it was busy), a libtorch
// program's cold start took 28 s (~330 page faults); reading its 516 MB of libraries ahead took
// 4.4 s, and the start then 0.5 s. The libraries are found from the files alone, as the dynamic
// loader finds them (DT_NEEDED; without DT_RUNPATH, the DT_RPATH of the needing object and of
// those that loaded it; `ld_library_path`; DT_RUNPATH; $ORIGIN expanded; /etc/ld.so.conf's
// directories; the default ones; a name loaded once): nothing runs, and nothing
// but regular files is opened. Best effort: a file that cannot be read, or is no 64-bit ELF, ends
// its branch; never throws; bounded (1,024 files, 8 GiB, 10 s; 256 names and 64 directories an
// object). A `binary` without '/' is looked up in `path` (a PATH value).
Prefetched prefetch_program(const std::string& binary, const std::string& ld_library_path = "",
                            const std::string& path = "");

}  // namespace troupe::control
