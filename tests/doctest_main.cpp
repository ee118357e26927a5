// The main of every unit-test binary: a helper process when asked (support/helper_main.hpp),
// otherwise doctest.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "support/helper_main.hpp"

int main(int argc, char** argv) {
  test_support::run_helper_if_asked(argc, argv);
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
