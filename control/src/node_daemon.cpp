#include "troupe/control/node_daemon.hpp"

#include <spdlog/spdlog.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "troupe/net/http.hpp"
#include "troupe/control/process.hpp"

namespace troupe::control {

using json = nlohmann::json;

NodeDaemon::NodeDaemon(DaemonConfig config) : config_(std::move(config)) {
  if (config_.resources.empty()) config_.resources = detect_resources();
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) throw std::runtime_error(std::string("eventfd: ") + std::strerror(errno));
}

NodeDaemon::~NodeDaemon() {
  stop();
  for (auto& [pid, fd] : pidfds_) ::close(fd);
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

std::string NodeDaemon::detect_resources() {
  long cores = ::sysconf(_SC_NPROCESSORS_ONLN);
  long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  return "CPU=" + std::to_string(cores > 0 ? cores : 1) + ",memory=" + std::to_string(pages > 0 ? pages * page : 0);
}

std::string NodeDaemon::head_link(std::chrono::steady_clock::time_point deadline) {
  for (;;) {
    try {
      auto res = net::http_call(config_.head_host, config_.head_port, "GET", "/api/v1/link", "", config_.token,
                                std::chrono::seconds(5));
      json parsed = json::parse(res.body, nullptr, false);
      if (res.status != 200) {
        std::string why = parsed.is_object() ? parsed.value("error", res.body) : res.body;
        throw std::runtime_error("head answered " + std::to_string(res.status) + ": " + why);
      }
      if (!parsed.is_object() || !parsed.contains("link")) throw std::runtime_error("head sent no link address");
      return parsed.at("link").get<std::string>();
    } catch (const ErrorException& e) {   // not up yet (NetCode::Unreachable): retry until the deadline
      if (std::chrono::steady_clock::now() > deadline) throw std::runtime_error("cannot reach the head: " + e.error().message);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));   // back-off: the head is not listening yet
    }
  }
}

void NodeDaemon::start(std::chrono::milliseconds timeout) {
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const auto link = head_link(deadline);
  hub_ = std::make_unique<net::LinkHub>(config_.token, net::self_identity("node daemon"));
  json hello{{"role", "node"}, {"address", config_.advertise}, {"hostname", host}, {"resources", config_.resources},
             {"pid", ::getpid()}};
  try {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    head_ = std::make_unique<net::HeadSession>(*hub_, link, hello, std::max(left, std::chrono::milliseconds(1000)));
    node_id_ = head_->welcome().at("node_id").get<std::uint64_t>();
  } catch (const std::exception& e) {   // ErrorException (NetCode), or a welcome without an id
    hub_->stop();
    throw std::runtime_error(std::string("the head did not register this node: ") + e.what());
  }
  std::filesystem::create_directories(std::filesystem::path(config_.session_dir) / "logs");
  spdlog::info("node {}: registered with {}:{} ({})", node_id_, config_.head_host, config_.head_port, config_.resources);
  orders_ = std::thread([this] { order_loop(); });
  reaper_ = std::thread([this] { reap_loop(); });
}

// Every order is pushed on the link; nothing wakes here but an order or the link's end.
void NodeDaemon::order_loop() {
  for (;;) {
    auto msg = head_->next(std::chrono::hours(1));
    if (!msg) continue;
    if (msg->kind == 0) {
      if (stopping_) return;
      spdlog::error("node {}: the link to the head ended ({}); stopping its workers", node_id_, msg->body.value("why", ""));
      finished_ = true;   // FT-3: a node the head declared dead stays dead
      wake();
      break;
    }
    run(msg->body);
  }
  std::map<std::uint64_t, pid_t> all;
  { std::lock_guard lk(mu_); all.swap(workers_); }
  for (auto& [id, pid] : all) terminate_process(pid, 1000);
}

void NodeDaemon::run(const json& cmd) {
  try {
    std::string kind = cmd.at("kind").get<std::string>();
    if (kind == "start_worker") start_worker(cmd.at("worker_id").get<std::uint64_t>(), cmd.at("binary").get<std::string>());
    else if (kind == "kill_worker") kill_worker(cmd.at("worker_id").get<std::uint64_t>());
    else spdlog::warn("node {}: unknown command '{}'", node_id_, kind);
  } catch (const std::exception& e) {
    spdlog::error("node {}: command {} failed: {}", node_id_, cmd.dump(), e.what());
  }
}

void NodeDaemon::start_worker(std::uint64_t worker_id, const std::string& binary) {
  ProcessSpec spec;
  spec.binary = binary;
  spec.args = {"--troupe-worker", std::to_string(worker_id)};
  spec.env = {{"TROUPE_HEAD", config_.head_host + ":" + std::to_string(config_.head_port)},
              {"TROUPE_TOKEN", config_.token},
              {"TROUPE_NODE_ID", std::to_string(node_id_)},
              {"TROUPE_BIND", config_.advertise},
              {"TROUPE_SESSION_DIR", config_.session_dir}};
  spec.log_path = (std::filesystem::path(config_.session_dir) / "logs" /
                   ("worker-" + std::to_string(worker_id) + ".log")).string();
  pid_t pid = spawn_process(spec);
  {
    std::lock_guard lk(mu_);
    workers_[worker_id] = pid;
    if (int fd = open_pidfd(pid); fd >= 0) pidfds_[pid] = fd;
  }
  wake();
  spdlog::info("node {}: started worker {} (pid {}): {}", node_id_, worker_id, pid, binary);
}

void NodeDaemon::kill_worker(std::uint64_t worker_id) {
  std::lock_guard lk(mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) return;
  ::kill(it->second, SIGTERM);
  terminating_[it->second] = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  workers_.erase(it);
  wake();
}

void NodeDaemon::wake() {
  const std::uint64_t one = 1;
  if (wake_fd_ >= 0) (void)!::write(wake_fd_, &one, sizeof one);
}

// Waits on the workers' pidfds (readable when one exits), the wake-up descriptor (a worker
// started or killed, or stopping) and the earliest SIGKILL deadline: no clock ticks here.
void NodeDaemon::reap_loop() {
  while (!stopping_ && !finished_) {
    std::vector<pollfd> fds{pollfd{wake_fd_, POLLIN, 0}};
    int timeout_ms = -1;
    {
      std::lock_guard lk(mu_);
      for (const auto& [pid, fd] : pidfds_) fds.push_back(pollfd{fd, POLLIN, 0});
      const auto now = std::chrono::steady_clock::now();
      for (const auto& [pid, deadline] : terminating_) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count() + 1;
        timeout_ms = timeout_ms < 0 ? int(std::max<long>(0, left)) : std::min(timeout_ms, int(std::max<long>(0, left)));
      }
      const bool unwatched = std::any_of(workers_.begin(), workers_.end(), [&](const auto& w) { return !pidfds_.contains(w.second); });
      if (unwatched && (timeout_ms < 0 || timeout_ms > 20)) timeout_ms = 20;   // a child without a pidfd (a kernel before 5.3): look again soon
    }
    if (::poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) {
      spdlog::error("node {}: poll: {}", node_id_, std::strerror(errno));
    }
    std::uint64_t drained = 0;
    (void)!::read(wake_fd_, &drained, sizeof drained);
    json events = json::array();
    {
      std::lock_guard lk(mu_);
      for (auto it = workers_.begin(); it != workers_.end();) {
        if (auto how = try_reap(it->second)) {
          if (*how == "exit 0") spdlog::info("node {}: worker {} (pid {}) exited", node_id_, it->first, it->second);
          else spdlog::warn("node {}: worker {} (pid {}) exited: {}", node_id_, it->first, it->second, *how);
          events.push_back(json{{"kind", "worker_exited"}, {"worker_id", it->first}, {"status", *how}});
          forget_pidfd(it->second);
          it = workers_.erase(it);
        } else {
          ++it;
        }
      }
      auto now = std::chrono::steady_clock::now();
      for (auto it = terminating_.begin(); it != terminating_.end();) {
        if (try_reap(it->first)) {
          forget_pidfd(it->first);
          it = terminating_.erase(it);
          continue;
        }
        if (now >= it->second) ::kill(it->first, SIGKILL);
        ++it;
      }
    }
    if (!events.empty() && !head_->send(net::head_kind::kEvents, json{{"events", events}})) {
      spdlog::error("node {}: could not report worker exits: the link to the head has ended", node_id_);
    }
  }
}

void NodeDaemon::forget_pidfd(pid_t pid) {
  if (auto it = pidfds_.find(pid); it != pidfds_.end()) {
    ::close(it->second);
    pidfds_.erase(it);
  }
}

void NodeDaemon::stop() {
  if (stopping_.exchange(true)) return;
  wake();
  if (head_) head_->close();
  if (orders_.joinable()) orders_.join();
  if (reaper_.joinable()) reaper_.join();
  if (hub_) hub_->stop();
  std::map<std::uint64_t, pid_t> all;
  std::map<pid_t, std::chrono::steady_clock::time_point> ending;
  { std::lock_guard lk(mu_); all.swap(workers_); ending.swap(terminating_); }
  for (auto& [id, pid] : all) terminate_process(pid, 2000);
  for (auto& [pid, deadline] : ending) terminate_process(pid, 500);
}

}  // namespace troupe::control
