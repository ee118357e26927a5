// troupe: start and stop a cluster's daemons and look at it.
//   troupe start --head [--port P] [--bind ADDR] [--token T | --token-file F] [--resources R] [--block]
//   troupe start --address HOST:PORT [--token ...] [--resources R] [--block]
//   troupe status [--address HOST:PORT] [--json]
//   troupe stop
#include <CLI/CLI.hpp>

#include <cstdlib>
#include <iostream>

#include "commands.hpp"

namespace {

void add_common(CLI::App* cmd, troupe::cli::CommonFlags& f) {
  cmd->add_option("--temp-dir", f.temp_dir, "Session root (default /tmp/troupe, or TROUPE_TMPDIR)");
  cmd->add_option("--token", f.token, "Cluster token");
  cmd->add_option("--token-file", f.token_file, "File whose first line is the cluster token");
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
  add_common(st, common);
  st->add_option("--address", common.address, "HOST:PORT of the head");
  st->add_flag("--json", as_json, "Print JSON for scripts");

  auto* sp = app.add_subcommand("stop", "Stop the head and daemons this machine started (and their workers)");
  add_common(sp, common);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    if (s->parsed()) return troupe::cli::start(start);
    if (st->parsed()) return troupe::cli::status(common, as_json);
    if (sp->parsed()) return troupe::cli::stop(common);
  } catch (const std::exception& e) {
    std::cerr << "troupe: " << e.what() << "\n";
    return 1;
  }
  return 2;
}
