// The `troupe` CLI's subcommands. Each returns the process exit status; errors are printed as
// one line on stderr ("troupe: ...").
#pragma once

#include <cstdint>
#include <string>

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
};

int start(const StartFlags& f);
// One cluster's status; with `all`, every live session under the temp dir (embedded runs too).
int status(const CommonFlags& f, bool json, bool all);
int stop(const CommonFlags& f);
// Removes what no driver owns any more (detached actors and groups) by hand.
int actor_kill(const CommonFlags& f, std::uint64_t id, const std::string& reason);
int group_remove(const CommonFlags& f, std::uint64_t id);

// The token from --token, --token-file, TROUPE_TOKEN or this machine's latest session, in that
// order; "" if none.
std::string resolve_token(const CommonFlags& f);
// The head address from --address, TROUPE_ADDRESS or this machine's latest session; "" if none.
std::string resolve_address(const CommonFlags& f);

}  // namespace troupe::cli
