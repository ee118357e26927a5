// troupe start: the head (with a node daemon beside it) or a node daemon, in the foreground
// (--block) or daemonized after it is up.
#include <signal.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <thread>

#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "troupe/control/head.hpp"
#include "troupe/control/node_daemon.hpp"
#include "troupe/net/address.hpp"
#include "troupe/net/http.hpp"
#include "troupe/net/session.hpp"
#include "troupe/net/token.hpp"

namespace troupe::cli {
namespace fs = std::filesystem;
namespace {

// Signals that stop a daemon are blocked in every thread and taken by sigtimedwait on main.
sigset_t stop_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGHUP);
  return set;
}

void log_to(const std::string& path) {
  auto logger = spdlog::basic_logger_mt("troupe", path);
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(logger);
  spdlog::set_level(spdlog::level::info);
}

std::string pid_file(const StartFlags& f) {
  fs::create_directories(fs::path(f.temp_dir) / "pids");
  return (fs::path(f.temp_dir) / "pids" / ((f.head ? "head-" : "node-") + std::to_string(::getpid()) + ".pid")).string();
}

// Waits for a stop signal (returned), or until `finished` says the daemon ended by itself (0).
template <class F>
int wait_for_stop(F finished) {
  sigset_t set = stop_signals();
  timespec tick{0, 200'000'000};
  while (!finished()) {
    if (int sig = sigtimedwait(&set, nullptr, &tick); sig > 0) return sig;
  }
  return 0;
}

// SIGTERM to a node's daemon is a preemption notice: the node drains first (its elastic members
// leave, its actors move), for at most the deadline, and then stops.
void drain_self(const std::string& host, std::uint16_t port, const std::string& token, std::uint64_t node, double deadline_s) {
  const std::string target = "/api/v1/nodes/" + std::to_string(node);
  try {
    auto res = net::http_call(host, port, "POST", target + "/drain", nlohmann::json{{"deadline_s", deadline_s}}.dump(), token,
                              std::chrono::seconds(5));
    if (res.status != 200) {
      spdlog::warn("node {}: the head did not drain it ({}): {}", node, res.status, res.body);
      return;
    }
    spdlog::info("node {}: draining before it stops (deadline {} s)", node, deadline_s);
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::milliseconds(std::int64_t(deadline_s * 1000) + 5000);
    while (std::chrono::steady_clock::now() < give_up) {   // each answer comes when its drain state changes
      auto got = net::http_call(host, port, "GET", target + "?wait_ms=5000", "", token, std::chrono::seconds(10));
      auto n = nlohmann::json::parse(got.body, nullptr, false);
      if (got.status != 200 || !n.is_object() || n.value("drain", "") != "draining") break;
    }
  } catch (const std::exception& e) {   // the head is gone (troupe stop stops it too): stop now
    spdlog::warn("node {}: no drain: {}", node, e.what());
  }
}

// A daemon holds a descriptor or two for each worker, link and connection, and its workers
// inherit its limits: the soft limit on open files goes up to the hard one, as `ray start` does,
// but not past kOpenFilesTarget (a hard limit of 2^20 or more, as containers set, would reach
// every job process: programs that size tables by the limit, or close every descriptor up to it,
// slow down). Returns what to log once the log is open (nothing when the limit stays as it was).
constexpr rlim_t kOpenFilesTarget = 65536;

struct LimitChange {
  std::string said;
  bool refused = false;
};

LimitChange raise_open_files_limit() {
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0) return {std::string("open files: getrlimit: ") + std::strerror(errno), true};
  const rlim_t target = lim.rlim_max == RLIM_INFINITY ? kOpenFilesTarget : std::min(lim.rlim_max, kOpenFilesTarget);
  if (lim.rlim_cur >= target) return {};
  const std::string change = std::to_string(lim.rlim_cur) + " to " + std::to_string(target);
  lim.rlim_cur = target;
  if (::setrlimit(RLIMIT_NOFILE, &lim) != 0)
    return {"open files: could not raise the soft limit from " + change + ": " + std::strerror(errno), true};
  return {"open files: the soft limit raised from " + change, false};
}

// Runs the daemon in this process. `ready` receives one line once it is up ("ok ..." or
// "error ..."), for the parent of a daemonized start.
int run_daemon(const StartFlags& f, int ready_fd) {
  auto say = [&](const std::string& line) {
    if (ready_fd >= 0) { (void)!::write(ready_fd, (line + "\n").data(), line.size() + 1); ::close(ready_fd); ready_fd = -1; }
    else std::cout << line << std::endl;
  };
  sigset_t set = stop_signals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);   // before any thread starts
  const LimitChange files = raise_open_files_limit();   // logged below, once the log is open
  std::string pidf = pid_file(f);
  try {
    std::unique_ptr<control::Head> head;
    std::string session, token = resolve_token(f), head_host = "127.0.0.1";
    std::uint16_t head_port = 0;
    if (f.head) {
      session = net::make_session_dir(f.temp_dir);
      if (token.empty() || (f.token.empty() && f.token_file.empty() && !std::getenv("TROUPE_TOKEN"))) token = net::random_token();
      net::write_private_file((fs::path(session) / "token").string(), token + "\n");
      log_to((fs::path(session) / "logs" / "head.log").string());
      control::HeadConfig hc;
      hc.bind = f.bind;
      hc.port = static_cast<std::uint16_t>(f.port);
      hc.token = token;
      hc.session_dir = session;
      hc.node_timeout = std::chrono::milliseconds(f.node_timeout_ms);
      hc.max_package_bytes = f.max_package_bytes;
      hc.package_store_bytes = f.package_store_bytes;
      head = std::make_unique<control::Head>(hc);
      head_port = head->port();
      head_host = f.bind == "0.0.0.0" ? "127.0.0.1" : f.bind;
      std::ofstream(fs::path(session) / "head_address") << head_host << ":" << head_port << "\n";
    } else {
      std::string address = resolve_address(f);
      if (address.empty()) throw std::invalid_argument("give --address HOST:PORT of the head (or --head)");
      auto [h, p] = net::split_address(address);
      head_host = h;
      head_port = p;
      if (token.empty()) throw std::invalid_argument("no cluster token: pass --token or --token-file");
      session = (fs::path(f.temp_dir) / "session_latest").string();
      fs::create_directories(fs::path(f.temp_dir));
      if (!fs::exists(session)) session = net::make_session_dir(f.temp_dir);
      log_to((fs::path(session) / "logs" / ("node-" + std::to_string(::getpid()) + ".log")).string());
    }
    if (files.refused) spdlog::warn("{}", files.said);
    else if (!files.said.empty()) spdlog::info("{}", files.said);
    control::DaemonConfig dc;
    dc.head_host = head_host;
    dc.head_port = head_port;
    dc.token = token;
    dc.resources = f.resources;
    dc.advertise = f.head ? head_host : f.bind;
    dc.session_dir = session;
    dc.work_dir = f.work_dir;
    dc.cache_dir = f.cache_dir;
    dc.local_log_bytes = f.local_log_bytes;
    control::NodeDaemon node(dc);
    node.start(std::chrono::seconds(10));
    std::ofstream(pidf) << ::getpid() << "\n";
    if (f.head) {
      say("ok " + head_host + ":" + std::to_string(head_port) + " " + session);
    } else {
      say("ok node " + std::to_string(node.node_id()) + " " + session);
    }
    const int sig = wait_for_stop([&] { return node.finished(); });
    if (sig == SIGTERM && !f.head && !node.finished()) drain_self(head_host, head_port, token, node.node_id(), f.drain_deadline_s);
    spdlog::info("stopping");
    node.stop();
    if (head) head->stop();
  } catch (const std::exception& e) {
    say(std::string("error ") + e.what());
    fs::remove(pidf);
    return 1;
  }
  fs::remove(pidf);
  return 0;
}

int report(const StartFlags& f, const std::string& line) {
  if (line.rfind("ok ", 0) != 0) {
    std::cerr << "troupe: " << (line.rfind("error ", 0) == 0 ? line.substr(6) : "the daemon did not start") << "\n";
    return 1;
  }
  std::istringstream in(line.substr(3));
  std::string first, second;
  in >> first >> second;
  if (f.head) {
    std::cout << "troupe head started at " << first << "\n"
              << "session:    " << second << "  (logs in " << second << "/logs)\n"
              << "token file: " << second << "/token\n"
              << "join a node: troupe start --address " << first << " --token-file " << second << "/token\n";
  } else {
    std::string session;
    in >> session;
    std::cout << "troupe node " << second << " joined the cluster (logs in " << session << "/logs)\n";
  }
  return 0;
}

}  // namespace

int start(const StartFlags& f) {
  if (f.head && !f.address.empty()) throw std::invalid_argument("give --head or --address, not both");
  if (f.block) return run_daemon(f, -1);
  int fds[2];
  if (::pipe(fds) != 0) throw std::runtime_error("pipe failed");
  pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {   // the daemon: its own session, no terminal
    ::close(fds[0]);
    ::setsid();
    std::FILE* null = std::fopen("/dev/null", "r+");
    if (null != nullptr) {
      ::dup2(fileno(null), STDIN_FILENO);
      ::dup2(fileno(null), STDOUT_FILENO);
      ::dup2(fileno(null), STDERR_FILENO);
    }
    std::_Exit(run_daemon(f, fds[1]));
  }
  ::close(fds[1]);
  std::string line;
  char c;
  while (::read(fds[0], &c, 1) == 1 && c != '\n') line += c;
  ::close(fds[0]);
  return report(f, line);
}

}  // namespace troupe::cli
