// troupe: start and stop a cluster's daemons and look at it.
//   troupe start --head [--port P] [--bind ADDR] [--token T | --token-file F] [--resources R] [--block]
//   troupe start --address HOST:PORT [--token ...] [--resources R] [--block]
//   troupe status [--address HOST:PORT] [--json] [--all]
//   troupe stop
//   troupe actor kill ID [--reason R]
//   troupe pg remove ID
#include <CLI/CLI.hpp>

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
  cmd->add_option("id", id, id_help)->required()->check(CLI::PositiveNumber);
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
  s->add_option("--bind", start.bind, "Address to listen on (default 127.0.0.1)");
  s->add_option("--resources", start.resources, "e.g. CPU=2,memory=8G,GPU=1 (default: detected)");
  s->add_option("--node-timeout-ms", start.node_timeout_ms, "Head: a node silent this long is dead")
      ->check(CLI::Range(200, 600000));
  s->add_flag("--block", start.block, "Stay in the foreground");

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
  auto* pg = app.add_subcommand("pg", "Placement groups (a detached one stays until removed here)");
  pg->require_subcommand(1);
  auto* remove = add_id_command(pg, "remove", "Remove a placement group: its bundles come free, its actors are killed",
                                "The group's id (troupe status)", common, target);

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
  } catch (const std::exception& e) {
    std::cerr << "troupe: " << e.what() << "\n";
    return 1;
  }
  return 2;
}
