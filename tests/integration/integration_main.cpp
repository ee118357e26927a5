// A worker process runs this same binary with --troupe-worker: troupe::init takes it over.
// Otherwise doctest runs the tests.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstring>

#include "support/helper_main.hpp"
#include "troupe/troupe.hpp"

int main(int argc, char** argv) {
  test_support::run_helper_if_asked(argc, argv);   // a driver process of a test, or nothing
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--troupe-worker") == 0) (void)troupe::init(argc, argv);   // never returns
  }
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
