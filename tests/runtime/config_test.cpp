// RuntimeConfig from flags and TROUPE_* variables.
#include <doctest/doctest.h>

#include <cstdlib>

#include "troupe/runtime.hpp"

TEST_CASE("flags override the environment and leave other arguments alone") {
  const char* argv[] = {"prog", "--steps", "5", "--troupe-threads", "3", "--troupe-log-level=error", "input.txt"};
  troupe::RuntimeConfig base;
  base.threads = 1;
  auto c = troupe::RuntimeConfig::from_args(7, argv, base);
  CHECK(c.threads == 3);
  CHECK(c.log_level == "error");
  CHECK(c.call_timeout.count() == 0);
}

TEST_CASE("TROUPE_* variables configure the runtime") {
  setenv("TROUPE_THREADS", "2", 1);
  setenv("TROUPE_CALL_TIMEOUT_MS", "1500", 1);
  CHECK(troupe::RuntimeConfig::from_env().remote_call_timeout.count() == 120000);
  setenv("TROUPE_REMOTE_CALL_TIMEOUT_MS", "5000", 1);
  auto c = troupe::RuntimeConfig::from_env();
  CHECK(c.threads == 2);
  CHECK(c.call_timeout.count() == 1500);
  CHECK(c.remote_call_timeout.count() == 5000);
  setenv("TROUPE_REMOTE_CALL_TIMEOUT_MS", "0", 1);   // never infinite (FT-1): refused
  CHECK_THROWS_AS(troupe::RuntimeConfig::from_env(), std::invalid_argument);
  unsetenv("TROUPE_THREADS");
  unsetenv("TROUPE_CALL_TIMEOUT_MS");
  unsetenv("TROUPE_REMOTE_CALL_TIMEOUT_MS");
}

TEST_CASE("bad values are rejected with a message naming the flag or variable") {
  const char* argv[] = {"prog", "--troupe-threads", "lots"};
  try {
    (void)troupe::RuntimeConfig::from_args(3, argv, {});
    FAIL("accepted a bad value");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()).find("--troupe-threads") != std::string::npos);
  }
  const char* level[] = {"prog", "--troupe-log-level", "loud"};
  CHECK_THROWS_AS(troupe::RuntimeConfig::from_args(3, level, {}), std::invalid_argument);
  setenv("TROUPE_CALL_TIMEOUT_MS", "-5", 1);
  try {
    (void)troupe::RuntimeConfig::from_env();
    FAIL("accepted a bad value");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()).find("TROUPE_CALL_TIMEOUT_MS") != std::string::npos);
  }
  unsetenv("TROUPE_CALL_TIMEOUT_MS");
}

TEST_CASE("flags win over variables, and only the value in force is checked") {
  setenv("TROUPE_THREADS", "lots", 1);                 // bad, but the flag overrides it
  setenv("TROUPE_REMOTE_CALL_TIMEOUT_MS", "0", 1);    // bad, overridden too
  setenv("TROUPE_LOG_LEVEL", "warn", 1);               // good, and in force
  const char* argv[] = {"prog", "--troupe-threads", "3", "--troupe-remote-call-timeout-ms", "700", "mine"};
  auto c = troupe::RuntimeConfig::from_args_and_env(6, argv);
  CHECK(c.threads == 3);
  CHECK(c.remote_call_timeout.count() == 700);
  CHECK(c.log_level == "warn");
  const char* bare[] = {"prog"};
  try {   // without the flag the variable is in force: refused, named
    (void)troupe::RuntimeConfig::from_args_and_env(1, bare);
    FAIL("accepted TROUPE_THREADS=lots");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()).find("TROUPE_THREADS") != std::string::npos);
  }
  const char* bad_flag[] = {"prog", "--troupe-threads", "x2", "--troupe-remote-call-timeout-ms", "9"};
  try {   // a bad flag is named as the flag, not as the variable
    (void)troupe::RuntimeConfig::from_args_and_env(5, bad_flag);
    FAIL("accepted --troupe-threads x2");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()).find("--troupe-threads") != std::string::npos);
  }
  unsetenv("TROUPE_THREADS");
  unsetenv("TROUPE_REMOTE_CALL_TIMEOUT_MS");
  unsetenv("TROUPE_LOG_LEVEL");
}
