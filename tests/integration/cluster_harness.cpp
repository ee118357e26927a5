#include "cluster_harness.hpp"

#include "troupe/proc_file.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace itest {
namespace fs = std::filesystem;
using json = nlohmann::json;

troupe::Runtime connect(const Cluster& c, std::chrono::seconds call_timeout) {
  troupe::RuntimeConfig cfg;
  cfg.address = c.address();
  cfg.token = c.token();
  cfg.remote_call_timeout = call_timeout;
  return troupe::Runtime::create(cfg).value();
}

pid_t start_helper(const std::string& name, const std::string& arg, int* out) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe");
  std::string exe = "/proc/self/exe", flag = "--test-helper", n = name, a = arg;
  std::vector<char*> argv{exe.data(), flag.data(), n.data(), a.data(), nullptr};
  pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork");
  if (pid == 0) {   // async-signal-safe calls only until exec
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    ::dup2(fds[1], 1);   // dup2 clears CLOEXEC on the copy
    ::execv("/proc/self/exe", argv.data());
    ::_exit(127);
  }
  ::close(fds[1]);
  *out = fds[0];
  return pid;
}

namespace {

// Reads what comes on fd until `stop(text)` holds, EOF, or the deadline.
template <class Stop>
std::string read_until(int fd, std::chrono::milliseconds timeout, Stop stop) {
  std::string text;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!stop(text)) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    pollfd p{fd, POLLIN, 0};
    if (left.count() <= 0 || ::poll(&p, 1, int(left.count())) <= 0) break;
    char c = 0;
    if (::read(fd, &c, 1) != 1) break;
    text += c;
  }
  return text;
}

}  // namespace

std::string read_line(int fd, std::chrono::milliseconds timeout) {
  std::string line = read_until(fd, timeout, [](const std::string& t) { return !t.empty() && t.back() == '\n'; });
  if (line.empty() || line.back() != '\n') return {};
  line.pop_back();
  return line;
}

std::string read_all(int fd, std::chrono::milliseconds timeout) {
  return read_until(fd, timeout, [](const std::string&) { return false; });
}

bool process_gone(pid_t pid) {
  std::string line;
  if (troupe::read_proc_file("/proc/" + std::to_string(pid) + "/stat", line) != 0 || line.empty()) return true;
  const auto paren = line.rfind(')');
  return paren != std::string::npos && line.size() > paren + 2 && line[paren + 2] == 'Z';
}

CommandResult run(const std::vector<std::string>& argv, std::chrono::seconds timeout) {
  int pipefd[2];
  if (::pipe2(pipefd, O_CLOEXEC) != 0) throw std::runtime_error("pipe");   // no other child keeps it open
  pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(pipefd[1], STDOUT_FILENO);
    ::dup2(pipefd[1], STDERR_FILENO);
    ::close(pipefd[0]);
    ::close(pipefd[1]);
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  ::close(pipefd[1]);
  ::fcntl(pipefd[0], F_SETFL, O_NONBLOCK);
  CommandResult r;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(pipefd[0], buf, sizeof buf);
    if (n > 0) { r.output.append(buf, std::size_t(n)); continue; }
    int status = 0;
    if (n == 0 && ::waitpid(pid, &status, 0) == pid) {   // EOF: the daemonized child closed its copy too
      r.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      break;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
      r.status = -1;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ::close(pipefd[0]);
  return r;
}

// Stops the daemons of clusters whose test process died without cleaning up (a crash skips
// destructors): each cluster directory names its owner, and an owner that is gone means litter.
void reap_orphans() {
  std::error_code ec;
  for (const auto& d : fs::directory_iterator("/tmp", ec)) {
    if (d.path().filename().string().rfind("troupe-it-", 0) != 0) continue;
    long owner = 0;
    std::ifstream(d.path() / "owner") >> owner;
    if (owner <= 0 || ::kill(pid_t(owner), 0) == 0) continue;
    for (const auto& p : fs::directory_iterator(d.path() / "pids", ec)) {
      long pid = 0;
      if (!(std::ifstream(p.path()) >> pid) || pid <= 0) continue;
      // Only a daemon of that cluster (its command line names the directory): the pid may have
      // been reused since, by a process of a test running now.
      std::string line;
      (void)troupe::read_proc_file("/proc/" + std::to_string(pid) + "/cmdline", line);
      std::replace(line.begin(), line.end(), '\0', ' ');
      if (line.find(d.path().string()) != std::string::npos) ::kill(pid_t(pid), SIGKILL);
    }
    fs::remove_all(d.path(), ec);
  }
}

namespace {

// What stops a cluster whose test process went without its destructor running (SIGTERM, SIGINT,
// a crash, kill -9, a ctest timeout): a shell that waits for its stdin, the read end of a pipe
// whose only write end this process holds, to end (the kernel closes it however the process
// goes), then does what the destructor does: `troupe stop` for the cluster's directory, and the
// directory removed. After a clean teardown the directory is gone and it does nothing. It is
// detached (a grandchild in its own session), so that a kill of this process's tree or group
// (ctest's timeout, a ^C) does not take it along. Returns the write end.
int start_guard(const std::string& dir) {
  static const char* const kScript =
      "cat >/dev/null; [ -d \"$2\" ] || exit 0; \"$1\" stop --temp-dir \"$2\"; rm -rf -- \"$2\"";
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe2");
  std::string sh = "/bin/sh", c = "-c", script = kScript, name = "troupe-it-guard", cli = TROUPE_CLI, d = dir;
  std::vector<char*> argv{sh.data(), c.data(), script.data(), name.data(), cli.data(), d.data(), nullptr};
  const long open_max = ::sysconf(_SC_OPEN_MAX);
  const pid_t child = ::fork();
  if (child < 0) throw std::runtime_error("fork");
  if (child == 0) {   // async-signal-safe calls only until exec
    if (::_Fork() != 0) ::_exit(0);
    ::setsid();
    // The read end as stdin (dup2 clears CLOEXEC on the copy; already 0 when this process had no
    // stdin); the write end closes at exec.
    if (fds[0] == 0) ::fcntl(0, F_SETFD, 0);
    else ::dup2(fds[0], 0);
    const int null = ::open("/dev/null", O_WRONLY);   // not the test's output: ctest waits for that to end
    ::dup2(null, 1);
    ::dup2(null, 2);
    // Nothing else of this process's: a pipe it held would never end.
    if (::close_range(3, ~0u, 0) != 0)
      for (long fd = 3; fd < open_max; ++fd) ::close(int(fd));
    ::execv("/bin/sh", argv.data());
    ::_exit(127);
  }
  while (::waitpid(child, nullptr, 0) < 0 && errno == EINTR) {
  }
  ::close(fds[0]);
  return fds[1];
}

}  // namespace

Cluster::Cluster(const std::string& head_resources, const std::vector<std::string>& head_flags) {
  static const bool reaped = (reap_orphans(), true);
  (void)reaped;
  char tmpl[] = "/tmp/troupe-it-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp");
  dir_ = tmpl;
  std::ofstream(fs::path(dir_) / "owner") << ::getpid() << "\n";
  guard_ = start_guard(dir_);
  try {
    int st = 0;
    std::vector<std::string> args{"start", "--head", "--port", "0", "--resources", head_resources};
    args.insert(args.end(), head_flags.begin(), head_flags.end());
    std::string out = cli(args, &st);
    std::smatch m;
    if (st != 0 || !std::regex_search(out, m, std::regex("started at (\\S+)"))) {
      throw std::runtime_error("troupe start --head failed: " + out);
    }
    address_ = m[1];
    std::ifstream(fs::path(dir_) / "session_latest" / "token") >> token_;
  } catch (...) {   // no destructor runs: the guard stops what started and removes the files
    ::close(guard_);
    throw;
  }
}

Cluster::~Cluster() {
  if (test_failed) {
    print_logs(60);
    print_stacks();
  }
  auto pids = daemon_pids();
  for (pid_t p : pids) ::kill(p, SIGCONT);   // a frozen daemon cannot stop its workers
  cli({"stop"});
  for (pid_t p : pids) ::kill(p, SIGKILL);
  // Workers die with their daemon (PR_SET_PDEATHSIG); give them a moment, then remove the files.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  std::error_code ec;
  fs::remove_all(dir_, ec);
  if (guard_ >= 0) ::close(guard_);   // its guard finds nothing left and exits
}

void Cluster::print_logs(std::size_t tail_lines) const {
  std::error_code ec;
  std::vector<fs::path> logs;
  for (auto it = fs::recursive_directory_iterator(dir_, fs::directory_options::none, ec);
       it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) break;
    if (it->is_symlink()) it.disable_recursion_pending();   // session_latest: the same files again
    else if (it->path().extension() == ".log") logs.push_back(it->path());
  }
  std::sort(logs.begin(), logs.end());
  for (const auto& p : logs) {
    std::ifstream in(p);
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) lines.push_back(std::move(line));
    const std::size_t from = lines.size() > tail_lines ? lines.size() - tail_lines : 0;
    std::cerr << "---- " << p.string() << " (last " << lines.size() - from << " of " << lines.size() << " lines)\n";
    for (std::size_t i = from; i < lines.size(); ++i) std::cerr << lines[i] << "\n";
  }
}

void Cluster::print_stacks() const {
  if (!fs::exists("/usr/bin/gdb")) return;
  for (pid_t p : daemon_pids()) {   // where each daemon's threads are: a hang shows itself here
    auto r = run({"/usr/bin/timeout", "30", "/usr/bin/gdb", "-p", std::to_string(p), "-batch", "-nx", "-ex",
                  "set pagination off", "-ex", "thread apply all bt 8"},
                 std::chrono::seconds(40));
    std::cerr << "---- threads of daemon " << p << "\n";
    std::istringstream lines(r.output);
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind("Thread ", 0) == 0 || line.rfind("#", 0) == 0) std::cerr << line.substr(0, 160) << "\n";
    }
  }
}

std::string Cluster::cli(const std::vector<std::string>& args, int* status, std::chrono::seconds timeout) const {
  std::vector<std::string> argv{TROUPE_CLI};
  argv.insert(argv.end(), args.begin(), args.end());
  if (std::find(args.begin(), args.end(), "--") == args.end()) {
    argv.push_back("--temp-dir");
    argv.push_back(dir_);
  }
  auto r = run(argv, timeout);
  if (status != nullptr) *status = r.status;
  return r.output;
}

CommandResult Cluster::job(const std::vector<std::string>& args, std::chrono::seconds timeout) const {
  std::vector<std::string> argv{TROUPE_CLI, "job"};
  auto dashes = std::find(args.begin(), args.end(), "--");
  argv.insert(argv.end(), args.begin(), dashes);
  for (const auto& a : {std::string("--address"), address_, std::string("--token"), token_, std::string("--temp-dir"), dir_}) {
    argv.push_back(a);
  }
  argv.insert(argv.end(), dashes, args.end());
  return run(argv, timeout);
}

pid_t Cluster::add_node(const std::string& resources, const std::vector<std::string>& flags) {
  auto before = daemon_pids();
  int st = 0;
  std::vector<std::string> args{"start", "--address", address_, "--token", token_, "--resources", resources};
  args.insert(args.end(), flags.begin(), flags.end());
  std::string out = cli(args, &st);
  if (st != 0) throw std::runtime_error("troupe start --address failed: " + out);
  for (pid_t p : daemon_pids()) {
    if (std::find(before.begin(), before.end(), p) == before.end()) return p;
  }
  throw std::runtime_error("no pid file for the new node");
}

std::vector<pid_t> Cluster::daemon_pids() const {
  std::vector<pid_t> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(fs::path(dir_) / "pids", ec)) {
    std::ifstream in(e.path());
    long p = 0;
    if (in >> p && p > 0) out.push_back(pid_t(p));
  }
  return out;
}

json Cluster::status() const {
  int st = 0;
  std::string out = cli({"status", "--json", "--address", address_, "--token", token_}, &st);
  if (st != 0) return json::object();
  return json::parse(out, nullptr, false);
}

json Cluster::node(int id) const {
  for (const auto& n : status().value("nodes", json::array())) if (n.value("id", 0) == id) return n;
  return json::object();
}

json Cluster::actor(std::uint64_t id) const {
  for (const auto& a : status().value("actors", json::array())) if (a.value("id", std::uint64_t{0}) == id) return a;
  return json::object();
}

}  // namespace itest
