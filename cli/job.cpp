// troupe job submit/status/list/logs/stop/delete: a client of the head's jobs API (README: Jobs).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <thread>

#include "commands.hpp"
#include "troupe/control/package.hpp"
#include "troupe/net/digest.hpp"
#include "troupe/net/http.hpp"

namespace troupe::cli {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::map<std::string, std::string> key_values(const std::vector<std::string>& items, const char* flag) {
  std::map<std::string, std::string> out;
  for (const auto& kv : items) {
    const auto eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) throw std::invalid_argument(std::string(flag) + " takes KEY=VALUE, not '" + kv + "'");
    out[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return out;
}

// The directory packed into a temporary archive, uploaded unless the head has its digest already.
std::string upload_working_dir(const CommonFlags& f, const std::string& dir) {
  if (!fs::is_directory(dir)) throw std::invalid_argument("--working-dir " + dir + " is not a directory");
  char tmpl[] = "/tmp/troupe-package-XXXXXX";
  const int fd = ::mkstemp(tmpl);
  if (fd < 0) throw std::runtime_error("cannot make a temporary file for the package");
  ::close(fd);
  struct Remove {
    std::string path;
    ~Remove() { std::remove(path.c_str()); }
  } remove{tmpl};
  control::pack_directory(dir, tmpl);
  const std::string digest = net::sha256_file(tmpl);
  auto [host, port] = head_endpoint(f);
  const std::string target = "/api/v1/packages/" + digest;
  auto have = net::http_call(host, port, "GET", target + "?stat=1", "", resolve_token(f), std::chrono::seconds(10));
  if (have.status == 200) return digest;   // uploaded before: content-addressed
  if (have.status != 404) {
    refused(have);
    throw std::runtime_error("cannot upload the working directory");
  }
  auto res = net::http_upload(host, port, "PUT", target, tmpl, resolve_token(f), std::chrono::minutes(10));
  if (res.status != 200) {
    refused(res);
    throw std::runtime_error("the head did not take the working directory's package");
  }
  return digest;
}

// The exit status a finished job stands for, as a shell would give it.
int exit_status(const json& j) {
  if (j.value("state", "") == "SUCCEEDED") return 0;
  if (j.contains("exit_code") && j["exit_code"].is_number()) return j["exit_code"].get<int>();
  if (j.contains("signal") && j["signal"].is_number()) return 128 + j["signal"].get<int>();
  return 1;
}

std::string text(const json& v) {
  if (v.is_null()) return "-";
  if (v.is_string()) return v.get<std::string>();
  return v.dump();
}

std::string job_target(const std::string& id, const std::string& verb = "") {
  std::string t = "/api/v1/jobs/" + id;
  return verb.empty() ? t : t + "/" + verb;
}

// Streams the job's log from `offset` to stdout until the job ends (following across a dropped
// connection from where it was). Returns 0, or 1 when the head could not be reached again.
int follow(const CommonFlags& f, const std::string& id, std::uint64_t offset) {
  auto [host, port] = head_endpoint(f);
  int failures = 0;
  for (;;) {
    try {
      auto res = net::http_stream(host, port, "GET", job_target(id, "logs") + "?follow=1&offset=" + std::to_string(offset),
                                  resolve_token(f),
                                  [&](std::string_view piece) {
                                    std::cout.write(piece.data(), std::streamsize(piece.size()));
                                    std::cout.flush();
                                    offset += piece.size();
                                    return true;
                                  },
                                  std::chrono::milliseconds(0));
      if (res.status != 200) return refused(res);
      return 0;
    } catch (const ErrorException& e) {   // the connection dropped: again from where it was
      if (++failures > 20) {
        std::cerr << "troupe: lost the head while following job " << id << ": " << e.error().message << "\n";
        return 1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(250 * failures));   // back-off: the head is unreachable
    }
  }
}

}  // namespace

int job_submit(const JobSubmitFlags& f) {
  if (f.entrypoint.empty()) throw std::invalid_argument("give the entrypoint after --: troupe job submit -- CMD ARGS...");
  json body{{"entrypoint", f.entrypoint}, {"entrypoint_resources", f.entrypoint_resources},
            {"max_attempts", f.max_attempts}, {"env", key_values(f.env, "--env")},
            {"metadata", key_values(f.metadata, "--metadata")}};
  if (!f.name.empty()) body["name"] = f.name;
  if (!f.submission_id.empty()) body["submission_id"] = f.submission_id;
  if (!f.working_dir.empty()) body["package"] = upload_working_dir(f, f.working_dir);
  json job;
  if (int rc = head_call(f, "POST", "/api/v1/jobs", body, &job)) return rc;
  const std::string id = std::to_string(job.value("id", std::uint64_t{0}));
  if (f.no_wait) {
    std::cerr << "troupe: job " << id << (job.value("created", true) ? " submitted" : " was submitted before") << " ("
              << job.value("state", "") << ": " << job.value("message", "") << ")\n";
    std::cout << id << std::endl;   // the id alone, last: for scripts
    return 0;
  }
  std::cerr << "troupe: job " << id << " submitted; following its logs (^C stops following, not the job)\n";
  if (int rc = follow(f, id, 0)) return rc;
  json end;
  if (int rc = head_call(f, "GET", job_target(id), nullptr, &end)) return rc;
  std::cerr << "troupe: job " << id << " " << end.value("state", "") << ": " << end.value("message", "") << "\n";
  return exit_status(end);
}

int job_status(const CommonFlags& f, const std::string& id, bool as_json) {
  json j;
  if (int rc = head_call(f, "GET", job_target(id), nullptr, &j)) return rc;
  if (as_json) {
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  for (const char* key : {"id", "name", "submission_id", "state", "message", "exit_code", "signal", "node", "driver_pid",
                          "attempts", "max_attempts", "entrypoint", "entrypoint_resources", "package", "submitted_at",
                          "started_at", "ended_at", "log_path"}) {
    std::cout << std::left << std::setw(22) << (std::string(key) + ":") << text(j.value(key, json(nullptr))) << "\n";
  }
  return 0;
}

int job_list(const CommonFlags& f, bool as_json) {
  json all;
  if (int rc = head_call(f, "GET", "/api/v1/jobs", nullptr, &all)) return rc;
  const json jobs = all.value("jobs", json::array());
  if (as_json) {
    std::cout << jobs.dump(2) << "\n";
    return 0;
  }
  std::cout << std::left << std::setw(6) << "ID" << std::setw(16) << "NAME" << std::setw(11) << "STATE" << std::setw(9)
            << "ATTEMPT" << std::setw(6) << "NODE" << std::setw(28) << "ENTRYPOINT" << "MESSAGE\n";
  for (const auto& j : jobs) {
    std::string entry;
    for (const auto& a : j.value("entrypoint", json::array())) {   // piecewise: GCC 12 warns falsely otherwise (-Wrestrict)
      if (!entry.empty()) entry += ' ';
      entry += a.get<std::string>();
    }
    if (entry.size() > 26) entry = entry.substr(0, 23) + "...";
    auto field = [&](const char* key) { return text(j.value(key, json())); };   // a server's reply may lack any of them
    std::cout << std::setw(6) << field("id") << std::setw(16) << field("name") << std::setw(11) << field("state")
              << std::setw(9) << (field("attempts") + "/" + field("max_attempts")) << std::setw(6) << field("node")
              << std::setw(28) << entry << field("message") << "\n";
  }
  return 0;
}

int job_logs(const CommonFlags& f, const std::string& id, bool follow_it) {
  if (follow_it) {
    json j;   // an unknown id is told as such before following
    if (int rc = head_call(f, "GET", job_target(id), nullptr, &j)) return rc;
    return follow(f, std::to_string(j.value("id", std::uint64_t{0})), 0);
  }
  auto [host, port] = head_endpoint(f);
  auto res = net::http_call(host, port, "GET", job_target(id, "logs"), "", resolve_token(f), std::chrono::seconds(30));
  if (res.status != 200) return refused(res);
  std::cout << res.body;
  return 0;
}

int job_stop(const CommonFlags& f, const std::string& id, double grace_s) {
  json j;
  if (int rc = head_call(f, "POST", job_target(id, "stop"), json{{"grace_s", grace_s}}, &j)) return rc;
  const std::string num = std::to_string(j.value("id", std::uint64_t{0}));
  if (j.value("already_ended", false)) {
    std::cout << "job " << num << " had already ended (" << j.value("state", "") << ")\n";
    return 0;
  }
  // Waits for its end on the log stream: it ends when the job does (an offset past any log).
  auto [host, port] = head_endpoint(f);
  const std::uint64_t past_end = std::uint64_t(1) << 62;
  auto res = net::http_stream(host, port, "GET", job_target(num, "logs") + "?follow=1&offset=" + std::to_string(past_end),
                              resolve_token(f), [](std::string_view) { return true; },
                              std::chrono::milliseconds(std::int64_t(grace_s * 1000) + 30000));
  if (res.status != 200) return refused(res);
  if (int rc = head_call(f, "GET", job_target(num), nullptr, &j)) return rc;
  std::cout << "job " << num << " " << j.value("state", "") << ": " << j.value("message", "") << "\n";
  return 0;
}

int job_scale(const CommonFlags& f, const std::string& id, const std::string& group, int replicas, int min, int max) {
  json body = json::object();
  if (replicas >= 0) body["replicas"] = replicas;
  if (min >= 0) body["min"] = min;
  if (max >= 0) body["max"] = max;
  if (body.empty()) throw std::invalid_argument("give --replicas N, or --min A and/or --max B");
  json g;
  if (int rc = head_call(f, "POST", job_target(id, "groups/" + group + "/scale"), body, &g)) return rc;
  std::cout << "job " << id << " group " << g.value("name", "") << ": target " << g.value("target", 0) << " in ["
            << g.value("min", 0) << ", " << g.value("max", 0) << "], " << g.value("live", 0) << " running\n";
  return 0;
}

int job_delete(const CommonFlags& f, const std::string& id) {
  json j;
  if (int rc = head_call(f, "DELETE", job_target(id), nullptr, &j)) return rc;
  std::cout << "job " << j.value("deleted", std::uint64_t{0}) << " deleted\n";
  return 0;
}

}  // namespace troupe::cli
