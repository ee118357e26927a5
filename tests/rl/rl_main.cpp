// rl_tests' main: a worker process of a test's run (--troupe-worker: troupe::init serves it and
// never returns), a helper process when asked, otherwise doctest.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstring>

#include "support/helper_main.hpp"
#include "troupe/troupe.hpp"

int main(int argc, char** argv) {
  test_support::run_helper_if_asked(argc, argv);
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--troupe-worker") == 0) (void)troupe::init(argc, argv);   // never returns
  }
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
