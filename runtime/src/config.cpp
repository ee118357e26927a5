// RuntimeConfig from TROUPE_* variables and --troupe-* flags, and troupe::init.
#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <fstream>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "cluster/worker.hpp"
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

}  // namespace

RuntimeConfig RuntimeConfig::from_env() {
  RuntimeConfig c;
  if (const char* v = std::getenv("TROUPE_THREADS")) c.threads = int(parse_nonnegative("TROUPE_THREADS", v));
  if (const char* v = std::getenv("TROUPE_LOG_LEVEL")) { check_level("TROUPE_LOG_LEVEL", v); c.log_level = v; }
  if (const char* v = std::getenv("TROUPE_CALL_TIMEOUT_MS")) {
    c.call_timeout = std::chrono::milliseconds(parse_nonnegative("TROUPE_CALL_TIMEOUT_MS", v));
  }
  if (const char* v = std::getenv("TROUPE_REMOTE_CALL_TIMEOUT_MS")) {
    c.remote_call_timeout = std::chrono::milliseconds(parse_positive("TROUPE_REMOTE_CALL_TIMEOUT_MS", v));
  }
  if (const char* v = std::getenv("TROUPE_ADDRESS")) c.address = v;
  if (const char* v = std::getenv("TROUPE_TOKEN_FILE")) c.token = read_token_file("TROUPE_TOKEN_FILE", v);
  if (const char* v = std::getenv("TROUPE_TOKEN")) c.token = v;
  if (const char* v = std::getenv("TROUPE_TMPDIR")) c.session_root = v;
  return c;
}

RuntimeConfig RuntimeConfig::from_args(int argc, const char* const* argv, RuntimeConfig base) {
  CLI::App app("troupe runtime");
  app.set_help_flag();     // --help belongs to the user's program
  app.allow_extras();
  std::string threads, level, timeout, remote_timeout, token_file;
  app.add_option("--troupe-threads", threads);
  app.add_option("--troupe-log-level", level);
  app.add_option("--troupe-call-timeout-ms", timeout);
  app.add_option("--troupe-remote-call-timeout-ms", remote_timeout);
  app.add_option("--address", base.address);
  app.add_option("--troupe-token", base.token);
  app.add_option("--troupe-token-file", token_file);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    throw std::invalid_argument(e.what());
  }
  if (!threads.empty()) base.threads = int(parse_nonnegative("--troupe-threads", threads));
  if (!level.empty()) { check_level("--troupe-log-level", level); base.log_level = level; }
  if (!timeout.empty()) {
    base.call_timeout = std::chrono::milliseconds(parse_nonnegative("--troupe-call-timeout-ms", timeout));
  }
  if (!remote_timeout.empty()) {
    base.remote_call_timeout =
        std::chrono::milliseconds(parse_positive("--troupe-remote-call-timeout-ms", remote_timeout));
  }
  if (!token_file.empty()) base.token = read_token_file("--troupe-token-file", token_file);
  return base;
}

Runtime init(int argc, char** argv) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--troupe-worker") detail::run_worker(argv[i + 1]);   // never returns
  }
  RuntimeConfig config;
  try {
    config = RuntimeConfig::from_args(argc, argv, RuntimeConfig::from_env());
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "troupe: %s\n", e.what());
    std::exit(2);
  }
  return Runtime::create(std::move(config));
}

}  // namespace troupe
