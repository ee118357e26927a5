#include "troupe/control/node_daemon.hpp"

#include <spdlog/spdlog.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "troupe/net/http.hpp"
#include "troupe/control/process.hpp"

namespace troupe::control {

using json = nlohmann::json;

NodeDaemon::NodeDaemon(DaemonConfig config) : config_(std::move(config)) {
  if (config_.resources.empty()) config_.resources = detect_resources();
}

NodeDaemon::~NodeDaemon() { stop(); }

std::string NodeDaemon::detect_resources() {
  long cores = ::sysconf(_SC_NPROCESSORS_ONLN);
  long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  return "CPU=" + std::to_string(cores > 0 ? cores : 1) + ",memory=" + std::to_string(pages > 0 ? pages * page : 0);
}

json NodeDaemon::post(const std::string& target, const json& body, std::chrono::milliseconds timeout) {
  auto res = net::http_call(config_.head_host, config_.head_port, "POST", target, body.dump(), config_.token, timeout);
  json parsed = json::parse(res.body, nullptr, false);
  if (res.status != 200) {
    std::string why = parsed.is_object() ? parsed.value("error", res.body) : res.body;
    throw std::runtime_error("head answered " + std::to_string(res.status) + ": " + why);
  }
  if (parsed.is_discarded()) throw std::runtime_error("head sent a body that is not JSON");
  return parsed;
}

void NodeDaemon::start(std::chrono::milliseconds timeout) {
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  json req{{"address", config_.advertise}, {"hostname", host}, {"resources", config_.resources}, {"pid", ::getpid()}};
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    try {
      node_id_ = post("/api/v1/nodes", req, std::chrono::seconds(5)).at("node_id").get<std::uint64_t>();
      break;
    } catch (const ErrorException& e) {   // not up yet (NetCode::Unreachable): retry until the deadline
      if (std::chrono::steady_clock::now() > deadline) {
        throw std::runtime_error("cannot reach the head: " + e.error().message);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  std::filesystem::create_directories(std::filesystem::path(config_.session_dir) / "logs");
  spdlog::info("node {}: registered with {}:{} ({})", node_id_, config_.head_host, config_.head_port, config_.resources);
  poller_ = std::thread([this] { poll_loop(); });
  reaper_ = std::thread([this] { reap_loop(); });
}

void NodeDaemon::poll_loop() {
  std::string target = "/api/v1/nodes/" + std::to_string(node_id_) + "/poll";
  while (!stopping_) {
    json res;
    try {
      res = post(target, json::object(), std::chrono::seconds(10));
    } catch (const std::exception& e) {
      spdlog::warn("node {}: poll failed: {}", node_id_, e.what());
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      continue;
    }
    if (res.value("state", "") == "dead") {   // FT-3: a dead node stays dead
      spdlog::error("node {}: the head declared this node dead; stopping its workers", node_id_);
      finished_ = true;
      break;
    }
    for (const auto& cmd : res.value("commands", json::array())) run(cmd);
  }
  if (finished_) {
    std::map<std::uint64_t, pid_t> all;
    { std::lock_guard lk(mu_); all.swap(workers_); }
    for (auto& [id, pid] : all) terminate_process(pid, 1000);
  }
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
  std::lock_guard lk(mu_);
  workers_[worker_id] = pid;
  spdlog::info("node {}: started worker {} (pid {}): {}", node_id_, worker_id, pid, binary);
}

void NodeDaemon::kill_worker(std::uint64_t worker_id) {
  std::lock_guard lk(mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) return;
  ::kill(it->second, SIGTERM);
  terminating_[it->second] = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  workers_.erase(it);
}

void NodeDaemon::reap_loop() {
  std::string target = "/api/v1/nodes/" + std::to_string(node_id_) + "/events";
  while (!stopping_ && !finished_) {
    json events = json::array();
    {
      std::lock_guard lk(mu_);
      for (auto it = workers_.begin(); it != workers_.end();) {
        if (auto how = try_reap(it->second)) {
          if (*how == "exit 0") spdlog::info("node {}: worker {} (pid {}) exited", node_id_, it->first, it->second);
          else spdlog::warn("node {}: worker {} (pid {}) exited: {}", node_id_, it->first, it->second, *how);
          events.push_back(json{{"kind", "worker_exited"}, {"worker_id", it->first}, {"status", *how}});
          it = workers_.erase(it);
        } else {
          ++it;
        }
      }
    }
    {
      std::lock_guard lk(mu_);
      auto now = std::chrono::steady_clock::now();
      for (auto it = terminating_.begin(); it != terminating_.end();) {
        if (try_reap(it->first)) { it = terminating_.erase(it); continue; }
        if (now > it->second) ::kill(it->first, SIGKILL);
        ++it;
      }
    }
    if (!events.empty()) {
      try {
        post(target, json{{"events", events}}, std::chrono::seconds(5));
      } catch (const std::exception& e) {
        spdlog::error("node {}: could not report worker exits: {}", node_id_, e.what());
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

void NodeDaemon::stop() {
  if (stopping_.exchange(true)) return;
  if (poller_.joinable()) poller_.join();
  if (reaper_.joinable()) reaper_.join();
  std::map<std::uint64_t, pid_t> all;
  std::map<pid_t, std::chrono::steady_clock::time_point> ending;
  { std::lock_guard lk(mu_); all.swap(workers_); ending.swap(terminating_); }
  for (auto& [id, pid] : all) terminate_process(pid, 2000);
  for (auto& [pid, deadline] : ending) terminate_process(pid, 500);
}

}  // namespace troupe::control
