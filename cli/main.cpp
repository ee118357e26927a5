// troupe: start and stop a cluster's daemons and look at it.
//   troupe start --head [--port P] [--bind ADDR] [--token T | --token-file F] [--resources R] [--block]
//   troupe start --address HOST:PORT [--token ...] [--resources R] [--block]
//   troupe status [--address HOST:PORT] [--json] [--all]
//   troupe stop
//   troupe actor kill ID [--reason R]
//   troupe pg remove ID
//   troupe node drain ID [--deadline-s S]
//   troupe job submit [--working-dir DIR] [--env K=V]... [--entrypoint-resources R] [--max-attempts K]
//                     [--name N] [--submission-id ID] [--metadata K=V]... [--no-wait] -- CMD ARGS...
//   troupe job status ID [--json] | list [--json] | logs ID [-f] | stop ID [--grace-s S] | delete ID
//   troupe job scale ID GROUP (--replicas N | --min A --max B)
#include <CLI/CLI.hpp>
#include <arpa/inet.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <iostream>

#include "commands.hpp"

namespace {

void add_common(CLI::App* cmd, troupe::cli::CommonFlags& f) {
  cmd->add_option("--temp-dir", f.temp_dir, "Session root (default /tmp/troupe, or TROUPE_TMPDIR)");
  cmd->add_option("--token", f.token, "Cluster token");
  cmd->add_option("--token-file", f.token_file, "File whose first line is the cluster token");
}

// An id as people write it: decimal digits, no leading zero (CLI11 alone reads 010 as 8 and 0x10
// as 16).
const CLI::Validator kDecimal(
    [](std::string& s) {
      const bool digits = !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
      return digits && (s.size() == 1 || s[0] != '0') ? std::string() : "'" + s + "' is not a decimal number (no leading zero)";
    },
    "DECIMAL");

// A number of seconds that is a number: CLI::Range lets nan through (no comparison holds for it).
const CLI::Validator kFinite(
    [](std::string& s) {
      char* end = nullptr;
      const double v = std::strtod(s.c_str(), &end);
      return end != s.c_str() && *end == '\0' && std::isfinite(v) ? std::string() : "'" + s + "' is not a finite number";
    },
    "FINITE");

// A command that talks to the head: the common flags and --address.
void add_head(CLI::App* cmd, troupe::cli::CommonFlags& f) {
  add_common(cmd, f);
  cmd->add_option("--address", f.address, "HOST:PORT of the head");
}

// `troupe <noun> <verb> ID`: the subcommand, with its head flags and a required positive id.
CLI::App* add_id_command(CLI::App* noun, const char* verb, const char* what, const char* id_help,
                         troupe::cli::CommonFlags& f, std::uint64_t& id) {
  auto* cmd = noun->add_subcommand(verb, what);
  add_head(cmd, f);
  cmd->add_option("id", id, id_help)->required()->check(kDecimal)->check(CLI::PositiveNumber);
  return cmd;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"troupe: a native actor runtime for RL post-training"};
  app.require_subcommand(1);
  troupe::cli::StartFlags start;
  troupe::cli::CommonFlags common;
  bool as_json = false;
  if (const char* v = std::getenv("TROUPE_TMPDIR")) start.temp_dir = common.temp_dir = v;

  auto* s = app.add_subcommand("start", "Start the head and a node daemon (--head), or a node daemon joining --address");
  add_common(s, start);
  s->add_flag("--head", start.head, "Start the head (and a node daemon) on this machine");
  s->add_option("--address", start.address, "HOST:PORT of the head to join");
  s->add_option("--port", start.port, "Head port (default 6380; 0 picks a free one)")->check(CLI::Range(0, 65535));
  s->add_option("--bind", start.bind, "Address to listen on (default 127.0.0.1)")
      ->check(CLI::Validator(
          [](std::string& a) {   // a node's workers listen there: checked now, not when each fails to
            in_addr v4{};
            in6_addr v6{};
            return ::inet_pton(AF_INET, a.c_str(), &v4) == 1 || ::inet_pton(AF_INET6, a.c_str(), &v6) == 1
                       ? std::string()
                       : "'" + a + "' is not an IP address";
          },
          "IP"));
  s->add_option("--resources", start.resources, "e.g. CPU=2,memory=8G,GPU=1 (default: detected)");
  s->add_option("--node-timeout-ms", start.node_timeout_ms, "Head: a node silent this long is dead")
      ->check(CLI::Range(200, 600000));
  s->add_flag("--block", start.block, "Stay in the foreground");
  s->add_option("--max-package-bytes", start.max_package_bytes, "Head: the largest job package it takes (default 1 GiB)")
      ->check(CLI::Range(std::uint64_t(1), std::uint64_t(1) << 40));
  s->add_option("--package-store-bytes", start.package_store_bytes,
                "Head: packages kept in all; past it the least recently used no live job names go (default 10 GiB)")
      ->check(CLI::Range(std::uint64_t(1), std::uint64_t(1) << 50));
  s->add_option("--drain-deadline-s", start.drain_deadline_s,
                "Node: SIGTERM drains it first (elastic members leave, actors move), for at most this long (default 30)")
      ->check(kFinite)->check(CLI::Range(0.0, 86400.0));
  s->add_option("--work-dir", start.work_dir, "Node: where jobs' directories go (default <session>/node-<pid>)");
  s->add_option("--cache-dir", start.cache_dir, "Node: where fetched job packages are kept (default <work-dir>/packages)");
  s->add_option("--local-log-bytes", start.local_log_bytes,
                "Node: a job process's output kept in this node's own copy, at most (default 64 MiB; the head keeps the job's log)")
      ->check(CLI::Range(std::uint64_t(1), std::uint64_t(1) << 50));

  auto* st = app.add_subcommand("status", "Nodes and actors of the cluster");
  add_head(st, common);
  st->add_flag("--json", as_json, "Print JSON for scripts");
  bool all_sessions = false;
  st->add_flag("--all", all_sessions, "Every live session on this machine, programs' embedded clusters too");

  auto* sp = app.add_subcommand("stop", "Stop the head and daemons this machine started (and their workers)");
  add_common(sp, common);

  std::uint64_t target = 0;
  std::string reason = "was killed by hand";
  auto* actor = app.add_subcommand("actor", "Actors (a detached one runs until killed here)");
  actor->require_subcommand(1);
  auto* kill = add_id_command(actor, "kill", "Kill an actor: its calls fail with ActorDied",
                              "The actor's id (troupe status)", common, target);
  kill->add_option("--reason", reason, "Why, as its callers will read it");
  double drain_deadline = 30;
  auto* node = app.add_subcommand("node", "Nodes of the cluster");
  node->require_subcommand(1);
  auto* drain = add_id_command(node, "drain",
                               "Drain a node: it takes nothing new, its actors move (elastic members leave), then it can be stopped",
                               "The node's id (troupe status)", common, target);
  drain->add_option("--deadline-s", drain_deadline, "Wait at most this long for its actors to move (default 30)")
      ->check(kFinite)->check(CLI::Range(0.0, 86400.0));
  auto* pg = app.add_subcommand("pg", "Placement groups (a detached one stays until removed here)");
  pg->require_subcommand(1);
  auto* remove = add_id_command(pg, "remove", "Remove a placement group: its bundles come free, its actors are killed",
                                "The group's id (troupe status)", common, target);

  auto* job = app.add_subcommand("job", "Jobs: a driver program run on a node of the cluster, watched and stopped from anywhere");
  job->require_subcommand(1);
  troupe::cli::JobSubmitFlags submit;
  if (const char* v = std::getenv("TROUPE_TMPDIR")) submit.temp_dir = v;
  auto* jsub = job->add_subcommand("submit", "Run CMD ARGS as a job's driver; follows its logs and exits with its status");
  add_head(jsub, submit);
  jsub->add_option("--name", submit.name, "A name to show");
  jsub->add_option("--submission-id", submit.submission_id, "Makes the submit idempotent: the same id and spec is one job");
  jsub->add_option("--working-dir", submit.working_dir, "Directory shipped to the nodes; the job runs in its copy")
      ->check(CLI::ExistingDirectory);
  jsub->add_option("--env", submit.env, "KEY=VALUE for the driver's environment (repeatable)");
  jsub->add_option("--metadata", submit.metadata, "KEY=VALUE kept with the job (repeatable)");
  jsub->add_option("--entrypoint-resources", submit.entrypoint_resources, "What the driver needs (default CPU=1)");
  jsub->add_option("--max-attempts", submit.max_attempts, "Attempts in all; a failed driver is started again")
      ->check(CLI::Range(1, 1000));
  jsub->add_flag("--no-wait", submit.no_wait, "Print the job id (last line) and return at once");
  jsub->add_option("entrypoint", submit.entrypoint, "-- CMD ARGS...")->required();
  std::string job_ref;
  bool follow = false;
  double grace_s = 10;
  auto job_id_command = [&](const char* verb, const char* what) {
    auto* cmd = job->add_subcommand(verb, what);
    add_head(cmd, common);
    cmd->add_option("id", job_ref, "The job's id or submission id")->required();
    return cmd;
  };
  auto* jstatus = job_id_command("status", "A job's state, attempts, exit code and times");
  jstatus->add_flag("--json", as_json, "Print JSON for scripts");
  auto* jlist = job->add_subcommand("list", "Every job the head knows");
  add_head(jlist, common);
  jlist->add_flag("--json", as_json, "Print JSON for scripts");
  auto* jlogs = job_id_command("logs", "A job's driver output and its workers' (prefixed with their actors)");
  jlogs->add_flag("-f,--follow", follow, "Follow until the job ends");
  auto* jstop = job_id_command("stop", "SIGTERM the driver's process group, SIGKILL after the grace; waits for the end");
  jstop->add_option("--grace-s", grace_s, "Seconds between SIGTERM and SIGKILL (default 10)")->check(kFinite)->check(CLI::Range(0.0, 3600.0));
  auto* jdelete = job_id_command("delete", "Remove an ended job's record, logs and package");
  std::string scale_group;
  int replicas = -1, scale_min = -1, scale_max = -1;
  auto* jscale = job_id_command("scale", "Change a running job's elastic group: its target or its bounds");
  jscale->add_option("group", scale_group, "The group's name")->required();
  jscale->add_option("--replicas", replicas, "The target, within [min, max]")->check(CLI::Range(1, 1000));
  jscale->add_option("--min", scale_min, "The least members the job runs with")->check(CLI::Range(1, 1000));
  jscale->add_option("--max", scale_max, "The most members")->check(CLI::Range(1, 1000));

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    if (s->parsed()) return troupe::cli::start(start);
    if (st->parsed()) return troupe::cli::status(common, as_json, all_sessions);
    if (sp->parsed()) return troupe::cli::stop(common);
    if (kill->parsed()) return troupe::cli::actor_kill(common, target, reason);
    if (remove->parsed()) return troupe::cli::group_remove(common, target);
    if (drain->parsed()) return troupe::cli::node_drain(common, target, drain_deadline);
    if (jsub->parsed()) return troupe::cli::job_submit(submit);
    if (jstatus->parsed()) return troupe::cli::job_status(common, job_ref, as_json);
    if (jlist->parsed()) return troupe::cli::job_list(common, as_json);
    if (jlogs->parsed()) return troupe::cli::job_logs(common, job_ref, follow);
    if (jstop->parsed()) return troupe::cli::job_stop(common, job_ref, grace_s);
    if (jdelete->parsed()) return troupe::cli::job_delete(common, job_ref);
    if (jscale->parsed()) return troupe::cli::job_scale(common, job_ref, scale_group, replicas, scale_min, scale_max);
  } catch (const std::exception& e) {
    std::cerr << "troupe: " << e.what() << "\n";
    return 1;
  }
  return 2;
}
