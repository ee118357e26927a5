#include "troupe/control/process.hpp"

#include <fcntl.h>
#include <signal.h>
#include <linux/close_range.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace troupe::control {

pid_t spawn_process(const ProcessSpec& spec) {
  // Everything the child needs is built before fork: after it, only async-signal-safe calls.
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string kv(*e);
    if (!spec.env.count(kv.substr(0, kv.find('=')))) env_strings.push_back(std::move(kv));
  }
  for (const auto& [k, v] : spec.env) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> arg_strings{spec.binary};
  arg_strings.insert(arg_strings.end(), spec.args.begin(), spec.args.end());
  std::vector<char*> argv;
  for (auto& s : arg_strings) argv.push_back(s.data());
  argv.push_back(nullptr);

  const bool own_log = spec.output_fd < 0;
  int log_fd = own_log ? ::open(spec.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644) : spec.output_fd;
  if (log_fd < 0) throw std::runtime_error("cannot open log " + spec.log_path + ": " + std::strerror(errno));
  sigset_t none;
  sigemptyset(&none);
  pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) {
    if (own_log) ::close(log_fd);
    throw std::runtime_error(std::string("fork failed: ") + std::strerror(errno));
  }
  if (pid == 0) {
    if (spec.die_with_parent) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(1);   // the parent died before prctl took effect
    }
    ::setpgid(0, 0);   // its own group: a terminal's ^C reaches the daemon, which stops it cleanly
    ::sigprocmask(SIG_SETMASK, &none, nullptr);   // the daemon's blocked stop signals are not its
    ::dup2(log_fd, STDOUT_FILENO);
    ::dup2(log_fd, STDERR_FILENO);
    int null_fd = ::open("/dev/null", O_RDONLY);
    if (null_fd >= 0) ::dup2(null_fd, STDIN_FILENO);
    // No descriptor of the daemon's reaches the worker (its listening sockets, the head's when
    // they share a process, its links): only what is opened without CLOEXEC would, so close all.
    ::close_range(3, ~0u, 0);
    if (!spec.cwd.empty() && ::chdir(spec.cwd.c_str()) != 0) ::_exit(127);
    if (spec.search_path) ::execvpe(spec.binary.c_str(), argv.data(), envp.data());
    else ::execve(spec.binary.c_str(), argv.data(), envp.data());
    ::_exit(127);
  }
  if (own_log) ::close(log_fd);
  return pid;
}

std::optional<std::string> try_reap(pid_t pid) {
  int status = 0;
  pid_t r = ::waitpid(pid, &status, WNOHANG);
  if (r == 0) return std::nullopt;
  if (r < 0) return std::string("gone");
  if (WIFEXITED(status)) return "exit " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "signal " + std::to_string(WTERMSIG(status));
  return std::string("stopped");
}

int open_pidfd(pid_t pid) { return int(::syscall(SYS_pidfd_open, pid, 0)); }

namespace {

// Polls `fd` (a pidfd) until it is readable or `deadline`: whether it became readable.
bool readable_by(int fd, std::chrono::steady_clock::time_point deadline) {
  pollfd p{fd, POLLIN, 0};
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    const int r = ::poll(&p, 1, int(left.count()));
    if (r > 0) return true;
    if (r < 0 && errno != EINTR) return false;
  }
}

}  // namespace

bool wait_exit(pid_t pid, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  const int fd = open_pidfd(pid);
  if (fd < 0) {
    if (errno == ESRCH) return true;   // already gone
    // No pidfd (a kernel before 5.3): nothing to wait on, so look now and then.
    while (::kill(pid, 0) == 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return ::kill(pid, 0) != 0;
  }
  const bool gone = readable_by(fd, deadline);
  ::close(fd);
  return gone;
}

void terminate_group(pid_t pid, int grace_ms) {
  if (pid <= 0) return;
  ::kill(-pid, SIGTERM);
  terminate_process(pid, grace_ms);
  ::kill(-pid, SIGKILL);   // what outlived its leader's grace
}

void terminate_process(pid_t pid, int grace_ms) {
  if (pid <= 0) return;
  if (try_reap(pid)) return;
  const int fd = open_pidfd(pid);
  ::kill(pid, SIGTERM);
  if (fd >= 0) {   // readable once it exits: waits for the exit itself, not on a clock
    readable_by(fd, std::chrono::steady_clock::now() + std::chrono::milliseconds(grace_ms));
    ::close(fd);
    if (try_reap(pid)) return;
  } else {   // no pidfd (a kernel before 5.3): a grace without a wake-up
    std::this_thread::sleep_for(std::chrono::milliseconds(grace_ms));
    if (try_reap(pid)) return;
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
}

}  // namespace troupe::control
