// troupe status, troupe stop, and the token/address defaults the commands share.
#include <nlohmann/json.hpp>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <thread>

#include "commands.hpp"
#include "troupe/control/process.hpp"
#include "troupe/net/address.hpp"
#include "troupe/net/http.hpp"
#include "troupe/net/session.hpp"

namespace troupe::cli {
namespace fs = std::filesystem;
using json = nlohmann::json;

std::string resolve_token(const CommonFlags& f) {
  if (!f.token.empty()) return f.token;
  if (!f.token_file.empty()) {
    std::ifstream in(f.token_file);
    std::string t;
    if (!in || !std::getline(in, t) || t.empty()) throw std::invalid_argument("cannot read a token from " + f.token_file);
    return t;
  }
  if (const char* t = std::getenv("TROUPE_TOKEN")) return t;
  return net::latest_session_token(f.temp_dir);
}

std::string resolve_address(const CommonFlags& f) {
  if (!f.address.empty()) return f.address;
  if (const char* a = std::getenv("TROUPE_ADDRESS")) return a;
  std::ifstream in(fs::path(f.temp_dir) / "session_latest" / "head_address");
  std::string a;
  if (in) std::getline(in, a);
  return a;
}

namespace {

// An actor's node as the table shows it: "-" while it has none (0).
std::string node_text(std::uint64_t node) { return node == 0 ? "-" : std::to_string(node); }

void print_table(const json& s) {
  std::cout << "head " << s.value("head", "") << "   logs: " << s.value("logs", "") << "\n\nNODES\n";
  std::cout << std::left << std::setw(6) << "ID" << std::setw(18) << "ADDRESS" << std::setw(7) << "STATE"
            << std::setw(34) << "TOTAL" << "AVAILABLE\n";
  for (const auto& n : s.at("nodes")) {
    const std::string drain = n.value("drain", "none");
    std::cout << std::setw(6) << n.value("id", 0) << std::setw(18) << n.value("address", "") << std::setw(7)
              << (drain == "none" || n.value("state", "") == "dead" ? n.value("state", "") : drain) << std::setw(34) << n.value("resources", "") << n.value("available", "") << "\n";
  }
  std::cout << "\nACTORS\n" << std::setw(18) << "ID" << std::setw(20) << "LABEL" << std::setw(16) << "TYPE" << std::setw(6) << "NODE"
            << std::setw(9) << "PID" << std::setw(11) << "STATE" << std::setw(10) << "RESTARTS" << "REASON\n";
  for (const auto& a : s.at("actors")) {
    std::cout << std::setw(18) << a.value("id", std::uint64_t{0}) << std::setw(20) << a.value("label", "")
              << std::setw(16) << a.value("type", "")
              << std::setw(6) << node_text(a.value("node", std::uint64_t{0})) << std::setw(9) << a.value("pid", 0) << std::setw(11)
              << a.value("state", "") << std::setw(10) << a.value("restarts", 0) << a.value("reason", "") << "\n";
  }
  std::cout << "\nPLACEMENT GROUPS\n" << std::setw(6) << "ID" << std::setw(15) << "STRATEGY" << std::setw(14)
            << "STATE" << "BUNDLES (resources@node)\n";
  for (const auto& g : s.value("placement_groups", json::array())) {
    std::string bundles;
    for (const auto& b : g.at("bundles")) {
      bundles += (bundles.empty() ? "" : "  ") + b.value("resources", "") + "@" +
                 (b.value("node", json()).is_number_unsigned() ? std::to_string(b["node"].get<std::uint64_t>()) : std::string("-"));
    }
    std::cout << std::setw(6) << g.value("id", 0) << std::setw(15) << g.value("strategy", "") << std::setw(14)
              << g.value("state", "") << bundles << "\n";
  }
  const json elastic = s.value("elastic_groups", json::array());
  if (!elastic.empty()) {
    std::cout << "\nELASTIC GROUPS\n" << std::setw(6) << "ID" << std::setw(16) << "NAME" << std::setw(6) << "JOB" << std::setw(5)
              << "MIN" << std::setw(5) << "MAX" << std::setw(8) << "TARGET" << std::setw(6) << "LIVE" << "WHY BELOW TARGET\n";
    for (const auto& g : elastic) {
      std::cout << std::setw(6) << g.value("id", 0) << std::setw(16) << g.value("name", "") << std::setw(6) << g.value("job", 0)
                << std::setw(5) << g.value("min", 0) << std::setw(5) << g.value("max", 0) << std::setw(8) << g.value("target", 0)
                << std::setw(6) << g.value("live", 0) << g.value("reason", "") << "\n";
    }
  }
}

}  // namespace

std::pair<std::string, std::uint16_t> head_endpoint(const CommonFlags& f) {
  std::string address = resolve_address(f);
  if (address.empty()) throw std::invalid_argument("no head address: pass --address HOST:PORT (or start a cluster here)");
  return net::split_address(address);
}

int refused(const net::HttpResponse& res) {
  json parsed = json::parse(res.body, nullptr, false);
  std::cerr << "troupe: the head refused (" << res.status << "): "
            << (parsed.is_object() ? parsed.value("error", res.body) : res.body) << "\n";
  return 1;
}

int head_call(const CommonFlags& f, const std::string& method, const std::string& target, const json& body, json* out) {
  auto [host, port] = head_endpoint(f);
  auto res = net::http_call(host, port, method, target, body.is_null() ? "" : body.dump(), resolve_token(f),
                            std::chrono::seconds(5));
  if (res.status != 200) return refused(res);
  if (out != nullptr) *out = json::parse(res.body, nullptr, false);
  return 0;
}

int node_drain(const CommonFlags& f, std::uint64_t id, double deadline_s) {
  json n;
  const std::string target = "/api/v1/nodes/" + std::to_string(id);
  if (int rc = head_call(f, "POST", target + "/drain", json{{"deadline_s", deadline_s}}, &n)) return rc;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::milliseconds(std::int64_t(deadline_s * 1000) + 30000);
  while (n.value("drain", "") == "draining" && std::chrono::steady_clock::now() < give_up) {   // answered on each change
    if (int rc = head_call(f, "GET", target + "?wait_ms=5000", nullptr, &n)) return rc;
  }
  if (n.value("drain", "") != "drained") {
    std::cerr << "troupe: node " << id << " is still " << n.value("drain", "") << "\n";
    return 1;
  }
  const auto left = n.value("drain_left", json::array());
  std::cout << "node " << id << " drained; it can be stopped" << (left.empty() ? "" : "; stopped before they could move:") << "\n";
  for (const auto& a : left) std::cout << "  " << a.get<std::string>() << "\n";
  return 0;
}

int actor_kill(const CommonFlags& f, std::uint64_t id, const std::string& reason) {
  json a;
  if (int rc = head_call(f, "POST", "/api/v1/actors/" + std::to_string(id) + "/kill", json{{"reason", reason}}, &a)) return rc;
  std::cout << "actor " << id << ": " << a.value("state", "") << "\n";
  return 0;
}

int group_remove(const CommonFlags& f, std::uint64_t id) {
  json r;
  if (int rc = head_call(f, "POST", "/api/v1/placement_groups/" + std::to_string(id) + "/remove", json::object(), &r)) return rc;
  std::cout << "placement group " << id << " removed (" << r.value("killed_actors", json::array()).size()
            << " actors killed)\n";
  return 0;
}

int status_all(const CommonFlags& f, bool as_json) {
  json all = json::array();
  for (const auto& dir : net::session_dirs(f.temp_dir)) {
    std::string address, token;
    std::ifstream(fs::path(dir) / "head_address") >> address;
    std::ifstream(fs::path(dir) / "token") >> token;
    if (address.empty() || token.empty()) continue;
    net::HttpResponse res;
    try {
      auto [host, port] = net::split_address(address);
      res = net::http_call(host, port, "GET", "/api/v1/status", "", token, std::chrono::seconds(1));
    } catch (const std::exception&) {   // its head is gone (or the address is bad): not live
      continue;
    }
    json body = json::parse(res.body, nullptr, false);
    if (res.status != 200 || !body.is_object()) continue;   // another head on a reused port
    body["session"] = dir;
    body["embedded"] = fs::exists(fs::path(dir) / "embedded");
    all.push_back(std::move(body));
  }
  if (as_json) {
    std::cout << all.dump(2) << "\n";
    return 0;
  }
  if (all.empty()) std::cout << "no live session under " << f.temp_dir << "\n";
  for (const auto& s : all) {
    std::cout << "== " << s.value("session", "") << (s.value("embedded", false) ? " (embedded in a program)" : "") << "\n";
    print_table(s);
    std::cout << "\n";
  }
  return 0;
}

int status(const CommonFlags& f, bool as_json, bool all) {
  if (all) return status_all(f, as_json);
  json body;
  if (int rc = head_call(f, "GET", "/api/v1/status", nullptr, &body)) return rc;
  if (as_json) std::cout << body.dump(2) << "\n"; else print_table(body);
  return 0;
}

int stop(const CommonFlags& f) {
  fs::path dir = fs::path(f.temp_dir) / "pids";
  std::error_code ec;
  int stopped = 0;
  std::vector<std::pair<pid_t, fs::path>> targets;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::ifstream in(e.path());
    long pid = 0;
    // SIGINT: stop now (a SIGTERM from outside is a preemption notice: a node drains first).
    if (in >> pid && pid > 0 && ::kill(pid_t(pid), SIGINT) == 0) targets.push_back({pid_t(pid), e.path()});
    else fs::remove(e.path(), ec);   // stale
  }
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (auto& [pid, path] : targets) {   // each waited for on its pidfd, all within 10 s
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (!troupe::control::wait_exit(pid, std::max(left, std::chrono::milliseconds(0)))) ::kill(pid, SIGKILL);
    fs::remove(path, ec);
    std::cout << "stopped " << path.stem().string() << "\n";
    ++stopped;
  }
  if (stopped == 0) std::cout << "nothing to stop\n";
  return 0;
}

}  // namespace troupe::cli
