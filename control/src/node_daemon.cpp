#include "troupe/control/node_daemon.hpp"

#include <spdlog/spdlog.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fcntl.h>
#include <fstream>
#include <string_view>

#include "troupe/control/package.hpp"
#include "troupe/control/process.hpp"
#include "troupe/net/digest.hpp"
#include "troupe/net/http.hpp"

namespace troupe::control {

using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

// A worker's output goes to the head in whole lines; a line longer than this goes as it is.
constexpr std::size_t kLongLine = 4096;

std::string gpu_list(const json& gpus) {
  std::string out;
  for (const auto& g : gpus) {   // appended piecewise: GCC 12 warns falsely on "," + to_string (-Wrestrict)
    if (!out.empty()) out += ',';
    out += std::to_string(g.get<int>());
  }
  return out;
}

// Reads the program `spec` starts, and its libraries, into the page cache before it starts
// (prefetch_program): run on the start thread, so one start's reads do not compete with another's.
void read_ahead(std::uint64_t node, const ProcessSpec& spec, const std::string& what) {
  auto setting = [&](const char* key) {
    if (auto it = spec.env.find(key); it != spec.env.end()) return it->second;
    const char* v = std::getenv(key);
    return std::string(v ? v : "");
  };
  std::string binary = spec.binary;
  if (binary.find('/') != std::string::npos && binary.front() != '/' && !spec.cwd.empty()) {
    binary = (fs::path(spec.cwd) / binary).string();
  }
  const auto began = std::chrono::steady_clock::now();
  const auto got = prefetch_program(binary, setting("LD_LIBRARY_PATH"), spec.search_path ? setting("PATH") : "");
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - began).count();
  // Slow only when the files were not cached: worth a line, as it delays the start.
  const auto level = ms >= 1000 ? spdlog::level::info : spdlog::level::debug;
  spdlog::log(level, "node {}: read {}'s {} files ({} MiB) ahead of its start in {} ms", node, what, got.files.size(),
              got.bytes >> 20, ms);
}

// Appends `bytes` to `path`, a regular file (made if missing). Never blocks and never follows a
// link: a job may replace its own log file (its directory is its own) with a FIFO or a symlink,
// and the reaper, which writes here under the daemon's lock, must not wait on one nor write
// elsewhere. False, with nothing written, when it cannot.
bool append_file(const std::string& path, std::string_view bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  struct stat st {};
  bool ok = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
  while (ok && !bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    ok = n > 0;
    if (ok) bytes.remove_prefix(std::size_t(n));
  }
  ::close(fd);
  return ok;
}

// The last line of a node's copy of a job process's output that reached the cap.
std::string capped_line(std::uint64_t cap, bool at_line_start) {
  return std::string(at_line_start ? "" : "\n") + "[troupe] this node's copy of the output stops here, at " + std::to_string(cap) +
         " bytes; the head keeps the job's log (troupe job logs)\n";
}

}  // namespace

NodeDaemon::NodeDaemon(DaemonConfig config) : config_(std::move(config)) {
  if (config_.resources.empty()) config_.resources = detect_resources();
  if (config_.work_dir.empty()) {
    config_.work_dir = (fs::path(config_.session_dir) / ("node-" + std::to_string(::getpid()))).string();
  }
  if (config_.cache_dir.empty()) config_.cache_dir = (fs::path(config_.work_dir) / "packages").string();
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) throw std::runtime_error(std::string("eventfd: ") + std::strerror(errno));
}

NodeDaemon::~NodeDaemon() {
  stop();
  for (auto& [pid, fd] : pidfds_) ::close(fd);
  for (auto& [fd, out] : outputs_) ::close(fd);
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
  fs::create_directories(fs::path(config_.session_dir) / "logs");
  fs::create_directories(fs::path(config_.work_dir) / "jobs");
  config_.work_dir = fs::canonical(config_.work_dir).string();   // what jobs see as TROUPE_JOB_DIR
  cache_ = std::make_unique<PackageCache>(config_.cache_dir, config_.cache_bytes);
  spdlog::info("node {}: registered with {}:{} ({}); jobs in {}", node_id_, config_.head_host, config_.head_port,
               config_.resources, config_.work_dir);
  orders_ = std::thread([this] { order_loop(); });
  reaper_ = std::thread([this] { reap_loop(); });
  starter_ = std::thread([this] { start_loop(); });
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
  std::map<std::uint64_t, Driver> drivers;
  { std::lock_guard lk(mu_); all.swap(workers_); drivers.swap(drivers_); }
  for (auto& [id, pid] : all) terminate_group(pid, 1000);
  for (auto& [job, d] : drivers) {   // the whole group: what the driver started goes with it
    ::kill(-d.pid, SIGTERM);
    terminate_process(d.pid, 1000);
    ::kill(-d.pid, SIGKILL);
  }
}

void NodeDaemon::run(const json& cmd) {
  try {
    std::string kind = cmd.at("kind").get<std::string>();
    if (kind == "start_worker" && cmd.value("job", std::uint64_t{0}) == 0) {
      try {
        start_worker(cmd.at("worker_id").get<std::uint64_t>(), cmd.at("binary").get<std::string>(), cmd);
      } catch (const std::exception& e) {   // no fork, no log file: the head learns of it as of any exit (start_loop)
        spdlog::error("node {}: start_worker failed: {}", node_id_, e.what());
        report(json{{"kind", "worker_exited"}, {"worker_id", cmd.value("worker_id", std::uint64_t{0})},
                    {"status", std::string("could not start: ") + e.what()}});
      }
    } else if (kind == "start_worker" || kind == "start_driver") {   // may fetch a package: the starter's
      {
        std::lock_guard lk(start_mu_);
        launches_.push_back(Launch{cmd});
      }
      start_cv_.notify_one();
    } else if (kind == "kill_worker") {
      kill_worker(cmd.at("worker_id").get<std::uint64_t>());
    } else if (kind == "stop_driver") {
      stop_driver(cmd.at("job").get<std::uint64_t>(), cmd.at("attempt").get<std::int64_t>(),
                  cmd.value("grace_ms", std::int64_t{10000}));
    } else {
      spdlog::warn("node {}: unknown command '{}'", node_id_, kind);
    }
  } catch (const std::exception& e) {
    spdlog::error("node {}: command {} failed: {}", node_id_, cmd.dump(), e.what());
  }
}

// A job's worker runs the job's binary (a relative path names a file of its package) from the
// job's directory, its output forwarded to the job's log; any other writes its own log file.
void NodeDaemon::start_worker(std::uint64_t worker_id, const std::string& binary, const json& command) {
  const auto job = command.value("job", std::uint64_t{0});
  ProcessSpec spec;
  spec.binary = binary;
  spec.args = {"--troupe-worker", std::to_string(worker_id)};
  spec.env = {{"TROUPE_HEAD", config_.head_host + ":" + std::to_string(config_.head_port)},
              {"TROUPE_TOKEN", config_.token},
              {"TROUPE_NODE_ID", std::to_string(node_id_)},
              {"TROUPE_BIND", config_.advertise},
              {"TROUPE_SESSION_DIR", config_.session_dir}};
  if (auto gpus = command.value("gpus", json::array()); !gpus.empty()) spec.env["CUDA_VISIBLE_DEVICES"] = gpu_list(gpus);
  spec.log_path = (fs::path(config_.session_dir) / "logs" / ("worker-" + std::to_string(worker_id) + ".log")).string();
  if (job != 0) {
    const std::string dir = prepare_job_dir(job, command.value("package", std::string()), [](const std::string&) {});
    if (!binary.empty() && binary.front() != '/') spec.binary = (fs::path(dir) / binary).string();
    spec.cwd = dir;
    spec.env["TROUPE_JOB_ID"] = std::to_string(job);
    spec.env["TROUPE_JOB_DIR"] = dir;
  }
  read_ahead(node_id_, spec, "worker " + std::to_string(worker_id));
  int write_end = -1;
  std::unique_lock lk(mu_);
  if (killed_early_.erase(worker_id) > 0) return;   // killed while its start was queued
  if (job != 0) {
    open_output(job, worker_id, spec.log_path, &write_end);
    spec.output_fd = write_end;
  }
  pid_t pid = -1;
  try {
    pid = spawn_process(spec);
  } catch (...) {
    if (write_end >= 0) ::close(write_end);
    throw;
  }
  if (write_end >= 0) ::close(write_end);
  workers_[worker_id] = pid;
  if (int fd = open_pidfd(pid); fd >= 0) pidfds_[pid] = fd;
  lk.unlock();
  wake();
  spdlog::info("node {}: started worker {} (pid {}): {}", node_id_, worker_id, pid, spec.binary);
}

void NodeDaemon::kill_worker(std::uint64_t worker_id) {
  std::lock_guard lk(mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) {
    killed_early_.insert(worker_id);   // a job's worker whose start is still queued does not start
    return;
  }
  ::kill(-it->second, SIGTERM);   // its group (it leads one: process.cpp): what it started goes with it
  terminating_[it->second] = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  workers_.erase(it);
  wake();
}

// ---- jobs -----------------------------------------------------------------------------------------

void NodeDaemon::start_loop() {
  for (;;) {
    Launch launch;
    {
      std::unique_lock lk(start_mu_);
      start_cv_.wait(lk, [&] { return stopping_ || finished_ || !launches_.empty(); });
      if (stopping_ || finished_) return;
      launch = std::move(launches_.front());
      launches_.pop_front();
    }
    const json& cmd = launch.command;
    try {
      if (cmd.at("kind") == "start_driver") {
        start_driver(cmd);
      } else {
        start_worker(cmd.at("worker_id").get<std::uint64_t>(), cmd.at("binary").get<std::string>(), cmd);
      }
    } catch (const std::exception& e) {
      spdlog::error("node {}: {} failed: {}", node_id_, cmd.value("kind", ""), e.what());
      if (cmd.value("kind", "") == "start_driver") {
        report(json{{"kind", "driver_exited"}, {"job", cmd.value("job", std::uint64_t{0})},
                    {"attempt", cmd.value("attempt", std::int64_t{0})}, {"status", e.what()}});
      } else {   // the head learns of it as of any worker that exited
        report(json{{"kind", "worker_exited"}, {"worker_id", cmd.value("worker_id", std::uint64_t{0})},
                    {"status", std::string("could not start: ") + e.what()}});
      }
    }
  }
}

std::string NodeDaemon::prepare_job_dir(std::uint64_t job, const std::string& package,
                                        const std::function<void(const std::string&)>& progress) {
  const fs::path dir = fs::path(config_.work_dir) / "jobs" / std::to_string(job);
  const fs::path marker = dir / kUnpackedMarker;
  {
    std::ifstream in(marker);
    std::string have;
    if (in && std::getline(in, have) && have == package) return dir.string();   // unpacked before
  }
  fs::create_directories(dir);
  if (!package.empty()) {
    if (!net::is_sha256_hex(package)) throw std::runtime_error("bad package digest '" + package + "'");
    if (!cache_->has(package)) {
      progress("fetching its package " + package.substr(0, 12) + " on node " + std::to_string(node_id_));
      const std::string part = cache_->path(package) + ".part-" + std::to_string(job);
      auto res = net::http_download(config_.head_host, config_.head_port, "/api/v1/packages/" + package, part,
                                    config_.token, config_.max_package_bytes, std::chrono::seconds(60));
      if (res.status != 200) {
        auto body = json::parse(res.body, nullptr, false);
        throw std::runtime_error("the head did not send package " + package + ": " +
                                 (body.is_object() ? body.value("error", res.body) : res.body));
      }
      const std::string got = net::sha256_file(part);
      if (got != package) {
        fs::remove(part);
        throw std::runtime_error("package " + package + " arrived with digest " + got);
      }
      cache_->add(package, part);
      spdlog::info("node {}: fetched package {} for job {}", node_id_, package, job);
    }
    progress("unpacking its package on node " + std::to_string(node_id_));
    auto st = unpack_package(cache_->path(package), dir.string(), 4 * config_.max_package_bytes);
    if (!st.ok()) throw std::runtime_error(st.error().message);
  }
  // Not through a symlink the package put there (O_NOFOLLOW): the marker is this daemon's file.
  const int fd = ::open(marker.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error("cannot write " + marker.string() + ": " + std::strerror(errno));
  const std::string line = package + "\n";
  const bool wrote = ::write(fd, line.data(), line.size()) == ssize_t(line.size());
  ::close(fd);
  if (!wrote) throw std::runtime_error("cannot write " + marker.string());
  return dir.string();
}

void NodeDaemon::start_driver(const json& cmd) {
  const auto job = cmd.at("job").get<std::uint64_t>();
  const auto attempt = cmd.at("attempt").get<std::int64_t>();
  const auto entrypoint = cmd.at("entrypoint").get<std::vector<std::string>>();
  if (entrypoint.empty()) throw std::runtime_error("an empty entrypoint");
  auto progress = [&](const std::string& message) {
    report(json{{"kind", "driver_progress"}, {"job", job}, {"attempt", attempt}, {"message", message}});
  };
  const std::string dir = prepare_job_dir(job, cmd.value("package", std::string()), progress);
  ProcessSpec spec;
  spec.binary = entrypoint[0];
  spec.args.assign(entrypoint.begin() + 1, entrypoint.end());
  spec.cwd = dir;
  spec.search_path = entrypoint[0].find('/') == std::string::npos;   // "sh": PATH; "./grpo": the job's
  spec.env = cmd.value("env", std::map<std::string, std::string>{});
  spec.env["TROUPE_ADDRESS"] = config_.head_host + ":" + std::to_string(config_.head_port);
  spec.env["TROUPE_TOKEN"] = config_.token;
  spec.env["TROUPE_JOB_ID"] = std::to_string(job);
  spec.env["TROUPE_JOB_ATTEMPT"] = std::to_string(attempt);
  spec.env["TROUPE_JOB_DIR"] = dir;
  spec.env["TROUPE_NODE_ID"] = std::to_string(node_id_);
  if (auto gpus = cmd.value("gpus", json::array()); !gpus.empty()) spec.env["CUDA_VISIBLE_DEVICES"] = gpu_list(gpus);
  const std::string local_log = (fs::path(dir) / ("driver-" + std::to_string(attempt) + ".log")).string();
  read_ahead(node_id_, spec, "job " + std::to_string(job) + "'s driver");
  std::unique_lock lk(mu_);
  if (stopped_early_.erase({job, attempt}) > 0) {
    lk.unlock();
    report(json{{"kind", "driver_exited"}, {"job", job}, {"attempt", attempt}, {"status", "stopped before it started"}});
    return;
  }
  int write_end = -1;
  const int out = open_output(job, 0, local_log, &write_end);
  spec.output_fd = write_end;
  pid_t pid = -1;
  try {
    pid = spawn_process(spec);
  } catch (...) {
    ::close(write_end);
    std::vector<net::LogPiece> ignored;
    close_output(out, ignored);
    throw;
  }
  ::close(write_end);
  drivers_[job] = Driver{job, attempt, pid, out, std::nullopt};
  if (int fd = open_pidfd(pid); fd >= 0) pidfds_[pid] = fd;
  lk.unlock();
  wake();
  spdlog::info("node {}: started job {}'s driver (attempt {}, pid {}): {}", node_id_, job, attempt, pid, entrypoint[0]);
  report(json{{"kind", "driver_started"}, {"job", job}, {"attempt", attempt}, {"pid", pid}});
}

void NodeDaemon::stop_driver(std::uint64_t job, std::int64_t attempt, std::int64_t grace_ms) {
  std::lock_guard lk(mu_);
  auto it = drivers_.find(job);
  if (it == drivers_.end() || it->second.attempt != attempt) {
    stopped_early_.insert({job, attempt});   // its start is still queued (fetching): it does not start
    return;
  }
  ::kill(-it->second.pid, SIGTERM);   // the whole group: a shell's children too
  it->second.kill_at = std::chrono::steady_clock::now() + std::chrono::milliseconds(grace_ms);
  spdlog::info("node {}: stopping job {}'s driver (pid {}), SIGKILL in {} ms", node_id_, job, it->second.pid, grace_ms);
  wake();
}

int NodeDaemon::open_output(std::uint64_t job, std::uint64_t worker, const std::string& local_log, int* write_end) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  ::fcntl(fds[0], F_SETFL, ::fcntl(fds[0], F_GETFL) | O_NONBLOCK);
  Output o{job, worker, local_log, 0, false, {}};
  std::error_code ec;
  if (const auto size = fs::file_size(local_log, ec); !ec) o.kept = size;   // appended to, as before
  if (o.kept >= config_.local_log_bytes) {   // full already (a reused directory): say so for this process
    append_file(local_log, capped_line(config_.local_log_bytes, true));
    o.capped = true;
  }
  outputs_[fds[0]] = std::move(o);
  *write_end = fds[1];
  return fds[0];
}

// What the drain of an ended driver's output reads at most, beside its 500 ms.
constexpr std::size_t kMaxDrainBytes = std::size_t(16) << 20;

bool NodeDaemon::read_output(int fd, bool drain, std::vector<net::LogPiece>& out, std::chrono::steady_clock::time_point until,
                             std::size_t* budget) {
  auto it = outputs_.find(fd);
  if (it == outputs_.end()) return false;
  Output& o = it->second;
  char buf[net::kMaxLogPiece];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n == 0) return false;
    if (n < 0) return errno == EAGAIN || errno == EINTR;
    keep_local(o, buf, std::size_t(n));
    if (o.worker == 0) {
      out.push_back(net::LogPiece{o.job, 0, std::string(buf, std::size_t(n))});
    } else {   // whole lines, so that the head can prefix each
      o.partial.append(buf, std::size_t(n));
      const auto last = o.partial.rfind('\n');
      if (last != std::string::npos) {
        out.push_back(net::LogPiece{o.job, o.worker, o.partial.substr(0, last + 1)});
        o.partial.erase(0, last + 1);
      }
      if (o.partial.size() > kLongLine) out.push_back(net::LogPiece{o.job, o.worker, std::exchange(o.partial, {})});
    }
    if (budget != nullptr) *budget -= std::min(*budget, std::size_t(n));
    if (!drain || (budget != nullptr && *budget == 0) || std::chrono::steady_clock::now() >= until) return true;
  }
}

// Opened for each piece, not held: a node with many workers would hold a descriptor more for each.
// A copy that cannot be written (no longer a regular file: see append_file) ends there.
void NodeDaemon::keep_local(Output& o, const char* bytes, std::size_t n) {
  if (o.capped) return;
  const std::uint64_t cap = config_.local_log_bytes;
  const std::size_t k = std::size_t(std::min<std::uint64_t>(n, cap - std::min(cap, o.kept)));   // > 0: not capped
  if (!append_file(o.local_log, std::string_view(bytes, k))) {
    spdlog::warn("node {}: job {}: its output is no longer copied to {}: not a regular file this node can write", node_id_,
                 o.job, o.local_log);
    o.capped = true;
    return;
  }
  o.kept += k;
  if (o.kept >= cap) {
    append_file(o.local_log, capped_line(cap, bytes[k - 1] == '\n'));
    o.capped = true;
  }
}

void NodeDaemon::close_output(int fd, std::vector<net::LogPiece>& out) {
  auto it = outputs_.find(fd);
  if (it == outputs_.end()) return;
  if (!it->second.partial.empty()) out.push_back(net::LogPiece{it->second.job, it->second.worker, it->second.partial});
  outputs_.erase(it);
  ::close(fd);
}

void NodeDaemon::send_logs(const std::vector<net::LogPiece>& pieces) {
  for (const auto& p : pieces) {
    for (std::size_t at = 0; at < p.data.size(); at += net::kMaxLogPiece) {
      net::LogPiece part{p.job, p.worker, p.data.substr(at, net::kMaxLogPiece)};
      if (!head_->send_bytes(net::head_kind::kLog, net::encode_log(part))) return;
    }
  }
}

void NodeDaemon::report(const json& event) {
  try {   // called from catch blocks (a failed start): nothing may be thrown from here
    if (!head_->send(net::head_kind::kEvents, json{{"events", json::array({event})}}))
      spdlog::error("node {}: could not report {}: the link to the head has ended", node_id_, event.value("kind", ""));
  } catch (const std::exception& e) {
    spdlog::error("node {}: could not report {}: {}", node_id_, event.value("kind", ""), e.what());
  }
}

void NodeDaemon::wake() {
  const std::uint64_t one = 1;
  if (wake_fd_ >= 0) (void)!::write(wake_fd_, &one, sizeof one);
}

// Waits on the children's pidfds (readable when one exits), their output pipes, the wake-up
// descriptor (a child started or killed, or stopping) and the earliest SIGKILL deadline: no clock
// ticks here.
void NodeDaemon::reap_loop() {
  while (!stopping_ && !finished_) {
    std::vector<pollfd> fds{pollfd{wake_fd_, POLLIN, 0}};
    int timeout_ms = -1;
    auto until = [&](std::chrono::steady_clock::time_point deadline, std::chrono::steady_clock::time_point now) {
      const long left = std::max<long>(0, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count() + 1);
      timeout_ms = timeout_ms < 0 ? int(left) : std::min(timeout_ms, int(left));
    };
    {
      std::lock_guard lk(mu_);
      for (const auto& [pid, fd] : pidfds_) fds.push_back(pollfd{fd, POLLIN, 0});
      for (const auto& [fd, out] : outputs_) fds.push_back(pollfd{fd, POLLIN, 0});
      const auto now = std::chrono::steady_clock::now();
      for (const auto& [pid, deadline] : terminating_) until(deadline, now);
      for (const auto& [job, d] : drivers_) {
        if (d.kill_at) until(*d.kill_at, now);
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
    std::vector<net::LogPiece> logs;
    {
      std::lock_guard lk(mu_);
      for (const auto& p : fds) {   // output first: a driver's last lines come before its end
        if (outputs_.contains(p.fd) && (p.revents & (POLLIN | POLLHUP | POLLERR)) && !read_output(p.fd, false, logs)) {
          for (auto& [job, d] : drivers_) {
            if (d.output == p.fd) d.output = -1;
          }
          close_output(p.fd, logs);
        }
      }
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
      const auto now = std::chrono::steady_clock::now();
      for (auto it = drivers_.begin(); it != drivers_.end();) {
        Driver& d = it->second;
        if (d.kill_at && now >= *d.kill_at) {   // the grace is over: once, then its pidfd tells the end
          ::kill(-d.pid, SIGKILL);
          d.kill_at.reset();
        }
        auto how = try_reap(d.pid);
        if (!how) {
          ++it;
          continue;
        }
        // The job ends with its driver: what is left of its process group goes too (JOB-1), and
        // then its output, whose writers are gone, is read to its end: for at most 500 ms and
        // kMaxDrainBytes (a writer in a session of its own outlives the group and may never stop).
        ::kill(-d.pid, SIGKILL);
        if (d.output >= 0) {
          const auto give_up = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
          std::size_t budget = kMaxDrainBytes;
          while (read_output(d.output, true, logs, give_up, &budget) && budget > 0 && std::chrono::steady_clock::now() < give_up) {
            pollfd p{d.output, POLLIN, 0};
            ::poll(&p, 1, 50);
          }
          close_output(d.output, logs);
        }
        spdlog::info("node {}: job {}'s driver (pid {}) ended: {}", node_id_, d.job, d.pid, *how);
        events.push_back(json{{"kind", "driver_exited"}, {"job", d.job}, {"attempt", d.attempt}, {"status", *how}});
        forget_pidfd(d.pid);
        it = drivers_.erase(it);
      }
      for (auto it = terminating_.begin(); it != terminating_.end();) {
        if (try_reap(it->first)) {
          forget_pidfd(it->first);
          it = terminating_.erase(it);
          continue;
        }
        if (now >= it->second) ::kill(-it->first, SIGKILL);
        ++it;
      }
    }
    send_logs(logs);   // before the exits they precede
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
  start_cv_.notify_all();
  if (head_) head_->close();
  if (orders_.joinable()) orders_.join();
  if (reaper_.joinable()) reaper_.join();
  if (starter_.joinable()) starter_.join();
  if (hub_) hub_->stop();
  std::map<std::uint64_t, pid_t> all;
  std::map<pid_t, std::chrono::steady_clock::time_point> ending;
  std::map<std::uint64_t, Driver> drivers;
  { std::lock_guard lk(mu_); all.swap(workers_); ending.swap(terminating_); drivers.swap(drivers_); }
  for (auto& [job, d] : drivers) ::kill(-d.pid, SIGTERM);
  for (auto& [id, pid] : all) terminate_group(pid, 2000);
  for (auto& [pid, deadline] : ending) terminate_group(pid, 500);
  for (auto& [job, d] : drivers) {
    terminate_process(d.pid, 2000);
    ::kill(-d.pid, SIGKILL);
  }
}

}  // namespace troupe::control
