// A worker process runs this same binary with --troupe-worker: troupe::init takes it over.
// Otherwise doctest runs the tests.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstring>

#include "troupe/troupe.hpp"

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--troupe-worker") == 0) (void)troupe::init(argc, argv);   // never returns
  }
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
