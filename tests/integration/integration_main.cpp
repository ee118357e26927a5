// A worker process runs this same binary with --troupe-worker: troupe::init takes it over.
// Otherwise doctest runs the tests.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstring>

#include "cluster_harness.hpp"
#include "support/helper_main.hpp"
#include "troupe/troupe.hpp"

namespace {

// Marks the running test as failed at its first failed assertion, so that a Cluster torn down
// after it prints its daemons' logs (what CI shows is all there is to go on).
struct FailureMark : doctest::IReporter {
  explicit FailureMark(const doctest::ContextOptions&) {}
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats&) override {}
  void test_case_start(const doctest::TestCaseData&) override { itest::test_failed = false; }
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats&) override {}
  void test_case_exception(const doctest::TestCaseException&) override { itest::test_failed = true; }
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData& a) override {
    if (a.m_failed) itest::test_failed = true;
  }
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}
};
REGISTER_LISTENER("failure-mark", 1, FailureMark);

}  // namespace

int main(int argc, char** argv) {
  test_support::run_helper_if_asked(argc, argv);   // a driver process of a test, or nothing
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--troupe-worker") == 0) (void)troupe::init(argc, argv);   // never returns
  }
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
