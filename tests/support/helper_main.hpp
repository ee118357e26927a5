// A test binary re-run as a helper process (fork, then exec of /proc/self/exe at once): the
// arguments `--test-helper NAME ARG` make its main run the helper registered as NAME with ARG,
// instead of the tests, and exit with the helper's status.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>

namespace test_support {

using HelperMain = int (*)(const std::string& arg);

inline std::map<std::string, HelperMain>& helpers() {
  static std::map<std::string, HelperMain> registered;   // safe from other static initialisers
  return registered;
}

inline bool register_helper(const char* name, HelperMain main) {
  helpers()[name] = main;
  return true;
}

// The first thing a test binary's main does. Never returns when a helper is asked for: static
// destructors are skipped (UCX and CAF threads of the helper may still run), output flushed.
inline void run_helper_if_asked(int argc, char** argv) {
  if (argc < 4 || std::strcmp(argv[1], "--test-helper") != 0) return;
  auto it = helpers().find(argv[2]);
  int status = 2;
  if (it == helpers().end()) std::fprintf(stderr, "no test helper '%s' in this binary\n", argv[2]);
  else status = it->second(argv[3]);
  std::fflush(nullptr);
  std::_Exit(status);
}

}  // namespace test_support

// Registers `fn` as helper `name`, at namespace scope in a test file.
#define TROUPE_TEST_HELPER(name, fn) \
  static const bool troupe_test_helper_##fn = ::test_support::register_helper(name, fn)
