// RuntimeConfig from TROUPE_* variables and --troupe-* flags, and troupe::init.
#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <fstream>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "cluster/worker.hpp"
#include "process_memory.hpp"
#include "troupe/runtime.hpp"

namespace troupe {
namespace {

const char* const kLevels[] = {"trace", "debug", "info", "warn", "error", "critical", "off"};

bool valid_level(const std::string& s) {
  for (const char* l : kLevels) if (s == l) return true;
  return false;
}

long parse_nonnegative(const std::string& what, const std::string& value) {
  std::size_t used = 0;
  long v = -1;
  try {
    v = std::stol(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != value.size() || v < 0) {
    throw std::invalid_argument(what + ": '" + value + "' is not a non-negative integer");
  }
  return v;
}

long parse_positive(const std::string& what, const std::string& value) {
  long v = parse_nonnegative(what, value);
  if (v == 0) throw std::invalid_argument(what + ": must be positive");
  return v;
}

std::string read_token_file(const std::string& what, const std::string& path) {
  std::ifstream in(path);
  std::string token;
  if (!in || !std::getline(in, token) || token.empty()) {
    throw std::invalid_argument(what + ": cannot read a token from '" + path + "'");
  }
  return token;
}

void check_level(const std::string& what, const std::string& value) {
  if (!valid_level(value)) {
    throw std::invalid_argument(what + ": '" + value + "' is not one of trace, debug, info, warn, error, critical, off");
  }
}

// What the command line gave, as text: a setting's flag wins over its variable.
struct FlagValues {
  std::string threads, level, timeout, remote_timeout, address, token, token_file;
};

// Parses the --troupe-* flags (and --address); every other argument is left alone.
FlagValues parse_flags(int argc, const char* const* argv) {
  FlagValues f;
  CLI::App app("troupe runtime");
  app.set_help_flag();     // --help belongs to the user's program
  app.allow_extras();
  app.add_option("--troupe-threads", f.threads);
  app.add_option("--troupe-log-level", f.level);
  app.add_option("--troupe-call-timeout-ms", f.timeout);
  app.add_option("--troupe-remote-call-timeout-ms", f.remote_timeout);
  app.add_option("--address", f.address);
  app.add_option("--troupe-token", f.token);
  app.add_option("--troupe-token-file", f.token_file);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    throw std::invalid_argument(e.what());
  }
  return f;
}

// The environment's values of the same settings; TROUPE_TMPDIR has no flag.
FlagValues env_values() {
  auto get = [](const char* name) { const char* v = std::getenv(name); return v == nullptr ? std::string() : std::string(v); };
  return FlagValues{get("TROUPE_THREADS"), get("TROUPE_LOG_LEVEL"), get("TROUPE_CALL_TIMEOUT_MS"),
                    get("TROUPE_REMOTE_CALL_TIMEOUT_MS"), get("TROUPE_ADDRESS"), get("TROUPE_TOKEN"),
                    get("TROUPE_TOKEN_FILE")};
}

// Applies the values given in `v` (empty: not given) over `c`; a bad one throws naming `names`'
// entry for it (the flag's or the variable's name, whichever it came from).
void apply(RuntimeConfig& c, const FlagValues& v, const FlagValues& names) {
  if (!v.threads.empty()) c.threads = int(parse_nonnegative(names.threads, v.threads));
  if (!v.level.empty()) { check_level(names.level, v.level); c.log_level = v.level; }
  if (!v.timeout.empty()) c.call_timeout = std::chrono::milliseconds(parse_nonnegative(names.timeout, v.timeout));
  if (!v.remote_timeout.empty()) {
    c.remote_call_timeout = std::chrono::milliseconds(parse_positive(names.remote_timeout, v.remote_timeout));
  }
  if (!v.address.empty()) c.address = v.address;
  if (!v.token.empty()) c.token = v.token;   // a token wins over a token file of the same source
  else if (!v.token_file.empty()) c.token = read_token_file(names.token_file, v.token_file);
}

const FlagValues kFlagNames{"--troupe-threads", "--troupe-log-level", "--troupe-call-timeout-ms",
                            "--troupe-remote-call-timeout-ms", "--address", "--troupe-token", "--troupe-token-file"};
const FlagValues kEnvNames{"TROUPE_THREADS", "TROUPE_LOG_LEVEL", "TROUPE_CALL_TIMEOUT_MS",
                           "TROUPE_REMOTE_CALL_TIMEOUT_MS", "TROUPE_ADDRESS", "TROUPE_TOKEN", "TROUPE_TOKEN_FILE"};

}  // namespace

RuntimeConfig RuntimeConfig::from_env() {
  RuntimeConfig c;
  apply(c, env_values(), kEnvNames);
  if (const char* v = std::getenv("TROUPE_TMPDIR")) c.session_root = v;
  return c;
}

RuntimeConfig RuntimeConfig::from_args(int argc, const char* const* argv, RuntimeConfig base) {
  const FlagValues flags = parse_flags(argc, argv);
  FlagValues given = flags;
  if (!flags.token.empty()) given.token_file.clear();   // --troupe-token wins over --troupe-token-file
  apply(base, given, kFlagNames);
  return base;
}

RuntimeConfig RuntimeConfig::from_args_and_env(int argc, const char* const* argv) {
  const FlagValues flags = parse_flags(argc, argv);
  FlagValues env = env_values();
  // A setting the command line gives is not read from the environment at all.
  if (!flags.threads.empty()) env.threads.clear();
  if (!flags.level.empty()) env.level.clear();
  if (!flags.timeout.empty()) env.timeout.clear();
  if (!flags.remote_timeout.empty()) env.remote_timeout.clear();
  if (!flags.address.empty()) env.address.clear();
  if (!flags.token.empty() || !flags.token_file.empty()) {
    env.token.clear();
    env.token_file.clear();
  }
  RuntimeConfig c;
  apply(c, env, kEnvNames);
  if (const char* v = std::getenv("TROUPE_TMPDIR")) c.session_root = v;
  return from_args(argc, argv, std::move(c));
}

Runtime init(int argc, char** argv) {
  const char* worker = nullptr;   // this process is a worker: the id it was started with
  for (int i = 1; i + 1 < argc && worker == nullptr; ++i)
    if (std::string(argv[i]) == "--troupe-worker") worker = argv[i + 1];
  detail::keep_tensor_memory(worker != nullptr);   // before any thread of the runtime allocates
  if (worker != nullptr) detail::run_worker(worker);   // never returns
  RuntimeConfig config;
  try {
    config = RuntimeConfig::from_args_and_env(argc, argv);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "troupe: %s\n", e.what());
    std::exit(2);
  }
  auto created = Runtime::create(std::move(config));   // joins a cluster named on the command line
  if (!created.ok()) {   // reported here, not at a spawn
    std::fprintf(stderr, "troupe: %s\n", created.error().to_string().c_str());
    std::exit(2);
  }
  return std::move(created).value();
}

}  // namespace troupe
