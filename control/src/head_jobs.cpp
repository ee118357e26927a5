// The head's job controller surface: packages (PUT streamed to disk, checked against their digest
// and their entries; GET streamed from disk), jobs (submit, list, status, stop, delete) and their
// logs (read from an offset, or followed as a chunked body until the job ends), and the node
// daemons' reports of the drivers they run and of their output. HeadState holds the jobs' states.
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "head_state.hpp"
#include "job_logs.hpp"
#include "troupe/control/head.hpp"
#include "troupe/control/package.hpp"
#include "troupe/ids.hpp"
#include "troupe/net/digest.hpp"
#include "troupe/net/head_link.hpp"

namespace troupe::control {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

json ms_or_null(std::int64_t ms) { return ms == 0 ? json(nullptr) : json(ms); }

// "" -> (""), "/12" -> ("12", ""), "/12/logs" -> ("12", "logs").
std::pair<std::string, std::string> split_segment(const std::string& rest) {
  if (rest.size() < 2) return {"", ""};
  const auto slash = rest.find('/', 1);
  return {rest.substr(1, slash == std::string::npos ? std::string::npos : slash - 1),
          slash == std::string::npos ? std::string() : rest.substr(slash + 1)};
}

std::uint64_t query_number(const net::HttpRequest& req, const char* key, std::uint64_t fallback) {
  auto it = req.query.find(key);
  if (it == req.query.end() || it->second.empty()) return fallback;
  try {
    std::size_t used = 0;
    const auto v = std::stoull(it->second, &used);
    if (used == it->second.size()) return v;
  } catch (const std::exception&) {
  }
  throw ErrorException(Error{ControlCode::BadRequest, std::string(key) + " must be a number"});
}

std::string unique_suffix() {
  std::random_device rd;
  return std::to_string(::getpid()) + "-" + std::to_string(rd());
}

}  // namespace

std::string Head::package_path(const std::string& digest) const { return packages_->path(digest); }

std::uint64_t Head::job_id(const std::string& text) {
  if (text.empty()) return 0;
  if (text.find_first_not_of("0123456789") == std::string::npos && text.size() < 20) {
    const auto id = std::stoull(text);
    if (state_->jobs().find(id) != nullptr) return id;
  }
  const JobRecord* j = state_->jobs().find_submission(text);
  return j != nullptr ? j->id : 0;
}

json Head::job_json(const JobRecord& j) const {
  return json{{"id", j.id},
              {"name", j.spec.name},
              {"submission_id", j.spec.submission_id},
              {"state", std::string(to_string(j.state))},
              {"message", j.message},
              {"exit_code", j.exit_code ? json(*j.exit_code) : json(nullptr)},
              {"signal", j.signal ? json(*j.signal) : json(nullptr)},
              {"node", j.node == 0 ? json(nullptr) : json(j.node)},
              {"driver_pid", j.driver_pid == 0 ? json(nullptr) : json(j.driver_pid)},
              {"attempts", j.attempts},
              {"max_attempts", j.spec.max_attempts},
              {"entrypoint", j.spec.entrypoint},
              {"entrypoint_resources", j.spec.resources.to_string()},
              {"package", j.spec.package},
              {"env", j.spec.env},
              {"metadata", j.spec.metadata},
              {"submitted_at", ms_or_null(j.submitted_ms)},
              {"started_at", ms_or_null(j.started_ms)},
              {"ended_at", ms_or_null(j.ended_ms)},
              {"log_path", logs_->path(j.id)}};
}

// ---- packages ----

net::HttpResponse Head::route_package(const net::HttpRequest& req, const std::string& digest) {
  if (!net::is_sha256_hex(digest)) return error_reply(400, "a package is named by its SHA-256: 64 lowercase hex characters");
  if (req.method == "PUT") return put_package(req, digest);
  if (req.method != "GET") return error_reply(404, "no such package endpoint: " + req.method);
  std::error_code ec;
  {
    std::lock_guard lk(mu_);
    if (!packages_->has(digest)) return error_reply(404, "no package " + digest);   // has(): used now
  }
  const auto size = fs::file_size(package_path(digest), ec);
  if (ec) return error_reply(404, "no package " + digest);
  if (req.query.contains("stat")) return reply(200, json{{"digest", digest}, {"size", size}});
  net::HttpResponse res;
  res.content_type = "application/x-tar";
  res.file = package_path(digest);
  return res;
}

// Streamed to a file of its own beside the packages, hashed as it comes, and moved in only once
// its digest and every entry are checked: a refused upload leaves nothing behind.
net::HttpResponse Head::put_package(const net::HttpRequest& req, const std::string& digest) {
  const std::uint64_t limit = config_.max_package_bytes;
  std::error_code ec;
  if (fs::exists(package_path(digest), ec)) {
    return reply(200, json{{"digest", digest}, {"size", fs::file_size(package_path(digest), ec)}, {"existed", true}});
  }
  if (req.body_reader == nullptr) return error_reply(400, "no body");
  if (auto len = req.body_reader->content_length(); len && *len > limit) {
    return error_reply(Error{ControlCode::TooLarge, "the package is " + std::to_string(*len) + " bytes, over the head's limit of " +
                                                    std::to_string(limit)});
  }
  const std::string tmp = package_path(digest) + ".upload-" + unique_suffix();
  struct Cleanup {
    std::string path;
    ~Cleanup() {
      std::error_code e;
      if (!path.empty()) fs::remove(path, e);
    }
  } cleanup{tmp};
  std::uint64_t total = 0;
  net::Sha256 hash;
  {
    std::ofstream out(tmp, std::ios::binary);
    if (!out) return error_reply(500, "cannot write " + tmp);
    std::vector<char> buf(1 << 16);
    for (;;) {
      std::size_t n = 0;
      try {
        n = req.body_reader->read(buf.data(), buf.size());
      } catch (const std::exception& e) {
        return error_reply(400, std::string("the upload broke off: ") + e.what());
      }
      if (n == 0) break;
      total += n;
      if (total > limit) {
        return error_reply(Error{ControlCode::TooLarge, "the package is over " + std::to_string(limit) + " bytes, the head's limit"});
      }
      hash.update(buf.data(), n);
      out.write(buf.data(), std::streamsize(n));
      if (!out) return error_reply(500, "cannot write " + tmp);
    }
  }
  const std::string got = hash.hex();
  if (got != digest) return error_reply(400, "digest mismatch: the bytes sent hash to " + got + ", not " + digest);
  if (auto st = check_package(tmp, 4 * limit); !st.ok()) return error_reply(st.error());
  {
    std::lock_guard lk(mu_);
    try {   // moved in; past the store's cap the least recently used no live job names go
      packages_->add(digest, tmp, [this](const std::string& d) {
        for (const auto& [id, j] : state_->jobs().all()) {
          if (!ended(j.state) && j.spec.package == d) return true;
        }
        return false;
      });
    } catch (const fs::filesystem_error& e) {
      return error_reply(500, std::string("cannot store the package: ") + e.what());
    }
  }
  cleanup.path.clear();
  spdlog::info("head: stored package {} ({} bytes)", digest, total);
  return reply(200, json{{"digest", digest}, {"size", total}, {"existed", false}});
}

// ---- jobs ----

net::HttpResponse Head::route_jobs(const net::HttpRequest& req, const std::string& rest) {
  if (rest.empty() || rest == "/") {
    if (req.method == "POST") return submit_job(parse_request(req.body));
    if (req.method != "GET") return error_reply(404, "no such jobs endpoint: " + req.method);
    std::lock_guard lk(mu_);
    json jobs = json::array();
    for (const auto& [id, j] : state_->jobs().all()) jobs.push_back(job_json(j));
    return reply(200, json{{"jobs", jobs}});
  }
  const auto [text, verb] = split_segment(rest);
  std::unique_lock lk(mu_);
  const std::uint64_t id = job_id(text);
  if (id == 0) return error_reply(404, "unknown job '" + text + "'");
  if (verb.empty() && req.method == "GET") return reply(200, job_json(*state_->jobs().find(id)));
  if (verb.empty() && req.method == "DELETE") {
    const std::string package = state_->jobs().find(id)->spec.package;
    if (auto st = state_->delete_job(id); !st.ok()) return error_reply(st.error());
    logs_->remove(id);
    // Its package goes with the last job that names it.
    bool used = package.empty();
    for (const auto& [jid, j] : state_->jobs().all()) used = used || j.spec.package == package;
    std::error_code ec;
    if (!used) fs::remove(package_path(package), ec);
    changed();
    return reply(200, json{{"deleted", id}});
  }
  if (verb == "stop" && req.method == "POST") {
    const json body = parse_request(req.body);
    if (!body.is_object()) return error_reply(400, "a stop request is a JSON object");
    auto grace = read_field<double>(body, "grace_s", 10.0);
    if (!grace.ok()) return error_reply(grace.error());
    if (*grace < 0 || *grace > 3600) return error_reply(400, "grace_s must be 0 to 3600");
    const bool was_ended = ended(state_->jobs().find(id)->state);
    auto j = state_->stop_job(id, std::int64_t(*grace * 1000));
    if (!j.ok()) return error_reply(j.error());
    changed();
    json out = job_json(**j);
    out["already_ended"] = was_ended;
    return reply(200, out);
  }
  if (verb.rfind("groups/", 0) == 0 && verb.size() > 13 && verb.substr(verb.size() - 6) == "/scale" && req.method == "POST") {
    const std::string name = verb.substr(7, verb.size() - 13);   // groups/{name}/scale
    const JobRecord* j = state_->jobs().find(id);
    for (const auto& [gid, g] : state_->elastic_groups()) {
      if (g.name == name && (g.job == id || g.owner == j->owner)) return scale_elastic(gid, parse_request(req.body));
    }
    return error_reply(404, "job " + std::to_string(id) + " has no elastic group '" + name + "'" +
                                (ended(j->state) ? " (it has ended)" : ""));
  }
  if (verb == "logs" && req.method == "GET") {
    lk.unlock();
    return job_logs(id, req);
  }
  return error_reply(404, "no such job endpoint: " + req.method + " " + verb);
}

net::HttpResponse Head::submit_job(const json& body) {
  auto spec = JobSpec::from_json(body);
  if (!spec.ok()) return error_reply(spec.error());
  // A new submission id names the job in URLs and in `troupe job stop REF`, where digits alone read
  // as a job id. Checked here, not in from_json: a store's older jobs keep theirs (the head loads them).
  if (const std::string& sid = spec->submission_id; !sid.empty()) {
    if (sid.find_first_not_of("0123456789") == std::string::npos)
      return error_reply(400, "submission_id '" + sid + "' is all digits: a job id reads so");
    if (sid.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") != std::string::npos)
      return error_reply(400, "submission_id '" + sid + "' may hold letters, digits, '.', '_' and '-' only");
  }
  std::error_code ec;
  if (!spec->package.empty() && !fs::exists(package_path(spec->package), ec)) {
    return error_reply(400, "package " + spec->package + " was not uploaded (PUT /api/v1/packages/" + spec->package + ")");
  }
  std::lock_guard lk(mu_);
  auto submitted = state_->submit_job(std::move(*spec));
  if (!submitted.ok()) return error_reply(submitted.error());
  const auto [j, created] = *submitted;
  if (created) logs_->open(j->id);
  changed();
  json out = job_json(*j);
  out["created"] = created;
  return reply(200, out);
}

// ?offset=N (bytes), &follow=1: the log from there, chunk by chunk until the job ends.
net::HttpResponse Head::job_logs(std::uint64_t id, const net::HttpRequest& req) {
  const std::uint64_t offset = query_number(req, "offset", 0);
  const bool follow = query_number(req, "follow", 0) != 0;
  net::HttpResponse res;
  res.content_type = "text/plain; charset=utf-8";
  if (!follow) {
    bool at_end = false;
    res.body = logs_->read(id, offset, std::size_t(config_.job_log_bytes) + 4096, &at_end);
    return res;
  }
  res.chunks = [this, id, offset](net::ChunkWriter& out) {
    std::uint64_t at = offset;
    for (;;) {
      bool at_end = false;
      std::string piece = logs_->read(id, at, 1 << 16, &at_end);
      if (!piece.empty()) {
        if (!out.write(piece)) return;
        at += piece.size();
        continue;
      }
      if (at_end || out.stopping()) return;
      logs_->wait(id, at, std::chrono::steady_clock::now() + std::chrono::seconds(1));
    }
  };
  return res;
}

// ---- what the nodes report ----

void Head::job_events(std::uint64_t node, const json& e) {
  const std::string kind = e.value("kind", "");
  const auto job = read_field<std::uint64_t>(e, "job");
  const auto attempt = read_field<std::int64_t>(e, "attempt");
  if (!job.ok() || !attempt.ok()) throw ErrorException(Error{ControlCode::BadRequest, "a driver event needs job and attempt"});
  if (kind == "driver_started") state_->driver_started(node, *job, *attempt, e.value("pid", std::int64_t{0}));
  else if (kind == "driver_progress") state_->driver_progress(node, *job, *attempt, e.value("message", std::string()));
  else if (kind == "driver_exited") state_->driver_exited(node, *job, *attempt, e.value("status", std::string("?")));
}

// A piece of a job's output from a node's daemon. A worker's whole lines are prefixed with its
// actors' labels and pid, as Ray's log_to_driver does: "(Counter#3 pid=123) line".
void Head::on_log(net::Link& link, std::vector<char>& body) {
  net::LogPiece piece;
  std::string prefix;
  {
    std::lock_guard lk(mu_);
    auto it = peers_.find(&link);
    if (it == peers_.end() || stopping_) return;
    if (it->second.role != Peer::Role::Node) {
      link.close("only a node's daemon sends logs");
      return;
    }
    try {
      piece = net::decode_log(body);
    } catch (const std::exception& e) {
      spdlog::warn("head: closing the link from {}: {}", link.address(), e.what());
      link.close(e.what());
      return;
    }
    const JobRecord* j = state_->jobs().find(piece.job);
    if (j == nullptr) return;   // deleted meanwhile
    if (piece.worker != 0) {
      std::string labels;
      std::int64_t pid = 0;
      if (auto* w = state_->workers().find(piece.worker)) {
        pid = w->pid;
        for (auto aid : w->actors) {
          if (const ActorRecord* a = state_->actor(aid)) {
            labels += (labels.empty() ? "" : ",") + actor_label(a->spec.name.empty() ? a->spec.type : a->spec.name, a->id);
          }
        }
      }
      prefix = "(" + (labels.empty() ? "worker " + std::to_string(piece.worker) : labels) + " pid=" + std::to_string(pid) + ") ";
    }
  }
  if (prefix.empty()) {
    logs_->append(piece.job, piece.data);
    return;
  }
  std::string out;
  std::size_t start = 0;
  while (start < piece.data.size()) {
    const auto nl = piece.data.find('\n', start);
    const auto end = nl == std::string::npos ? piece.data.size() : nl + 1;
    out += prefix;
    out.append(piece.data, start, end - start);
    if (nl == std::string::npos) out += '\n';
    start = end;
  }
  logs_->append(piece.job, out);
}

}  // namespace troupe::control
