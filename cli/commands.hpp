// The `troupe` CLI's subcommands. Each returns the process exit status; errors are printed as
// one line on stderr ("troupe: ...").
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "troupe/net/http.hpp"

namespace troupe::cli {

struct CommonFlags {
  std::string temp_dir = "/tmp/troupe";   // --temp-dir / TROUPE_TMPDIR: session root
  std::string token;                      // --token
  std::string token_file;                 // --token-file
  std::string address;                    // --address
};

struct StartFlags : CommonFlags {
  bool head = false;
  std::string bind = "127.0.0.1";
  int port = 6380;
  std::string resources;                  // empty: detect
  bool block = false;
  int node_timeout_ms = 2500;
  std::uint64_t max_package_bytes = std::uint64_t(1) << 30;   // head: a job package, at most
  std::uint64_t package_store_bytes = std::uint64_t(10) << 30;   // head: all packages (LRU past it)
  double drain_deadline_s = 30;           // node: SIGTERM drains it first, for at most this long
  std::string work_dir;                   // the node's job directories; "": <session>/node-<pid>
  std::string cache_dir;                  // its package cache; "": <work_dir>/packages
  std::uint64_t local_log_bytes = std::uint64_t(64) << 20;   // node: a job process's output in its own copy, at most
};

struct JobSubmitFlags : CommonFlags {
  std::string name, submission_id, working_dir;
  std::vector<std::string> env;                 // K=V
  std::vector<std::string> metadata;            // K=V
  std::string entrypoint_resources = "CPU=1";
  int max_attempts = 1;
  bool no_wait = false;
  std::vector<std::string> entrypoint;          // after --
};

int start(const StartFlags& f);
// One cluster's status; with `all`, every live session under the temp dir (embedded runs too).
int status(const CommonFlags& f, bool json, bool all);
int stop(const CommonFlags& f);
// Removes what no driver owns any more (detached actors and groups) by hand.
int actor_kill(const CommonFlags& f, std::uint64_t id, const std::string& reason);
int group_remove(const CommonFlags& f, std::uint64_t id);
// Drains a node and waits until it is drained; prints what could not move.
int node_drain(const CommonFlags& f, std::uint64_t id, double deadline_s);

// `troupe job ...` (job.cpp). ID is the job's number or its submission id.
int job_submit(const JobSubmitFlags& f);
int job_status(const CommonFlags& f, const std::string& id, bool json);
int job_list(const CommonFlags& f, bool json);
int job_logs(const CommonFlags& f, const std::string& id, bool follow);
int job_stop(const CommonFlags& f, const std::string& id, double grace_s);
int job_delete(const CommonFlags& f, const std::string& id);
// A running job's elastic group: its target (--replicas) or its bounds (--min/--max); -1: not given.
int job_scale(const CommonFlags& f, const std::string& id, const std::string& group, int replicas, int min, int max);

// The head's host and port (resolve_address); std::invalid_argument when there is none.
std::pair<std::string, std::uint16_t> head_endpoint(const CommonFlags& f);
// One call to the head's API: 0 and the JSON answer in *out, or 1 after printing the head's
// refusal for any status but 200.
int head_call(const CommonFlags& f, const std::string& method, const std::string& target, const nlohmann::json& body,
              nlohmann::json* out);
// Prints a non-200 answer's error on stderr; returns 1.
int refused(const net::HttpResponse& res);

// The token from --token, --token-file, TROUPE_TOKEN or this machine's latest session, in that
// order; "" if none.
std::string resolve_token(const CommonFlags& f);
// The head address from --address, TROUPE_ADDRESS or this machine's latest session; "" if none.
std::string resolve_address(const CommonFlags& f);

}  // namespace troupe::cli
