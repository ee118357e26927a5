// The GRPO example in worker processes (trainer and rollout engine colocated in one worker, reference
// and reward in their own) takes exactly the steps it takes in-process.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cluster_harness.hpp"
#include "support/temp_dir.hpp"

namespace {

std::vector<nlohmann::json> run_grpo(const std::string& dir, bool workers) {
  std::vector<std::string> argv{TROUPE_GRPO, "--steps", "3", "--sft-steps", "20", "--heldout-size", "50",
                                "--train-size", "200", "--prompts", "8", "--eval-every", "3", "--run-dir", dir};
  if (workers) argv.push_back("--worker-processes");
  argv.insert(argv.begin(), {"/usr/bin/env", "TROUPE_TMPDIR=" + dir + "-sessions"});
  auto res = itest::run(argv, std::chrono::seconds(120));
  REQUIRE_MESSAGE(res.status == 0, res.output);
  std::vector<nlohmann::json> lines;
  std::ifstream in(std::filesystem::path(dir) / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

}  // namespace

TEST_CASE("GRPO in worker processes takes the same steps as in-process") {
  test_support::TempDir dir("troupe-grpo");
  const std::string& root = dir.path;
  auto local = run_grpo(root + "/local", false);
  auto remote = run_grpo(root + "/workers", true);
  REQUIRE(local.size() == 3);
  REQUIRE(remote.size() == local.size());
  for (std::size_t i = 0; i < local.size(); ++i) {
    CHECK(remote[i]["reward_mean"] == local[i]["reward_mean"]);
    CHECK(remote[i]["loss"] == local[i]["loss"]);
    CHECK(remote[i]["policy_version"] == local[i]["policy_version"]);
  }
}

TEST_CASE("the GRPO example runs as a job, its binaries as the working directory, as README shows it") {
  test_support::TempDir dir("troupe-grpo-job");
  itest::Cluster c("CPU=4");
  const std::string bin = std::filesystem::path(TROUPE_GRPO).parent_path().string();
  const std::string run_dir = dir.path + "/run";
  auto r = c.job({"submit", "--working-dir", bin, "--", "./grpo", "--steps", "3", "--sft-steps", "20", "--heldout-size", "50",
                  "--train-size", "200", "--prompts", "8", "--eval-every", "3", "--worker-processes", "--run-dir", run_dir},
                 std::chrono::seconds(150));
  INFO(r.output);
  REQUIRE(r.status == 0);
  std::ifstream in(std::filesystem::path(run_dir) / "metrics.jsonl");
  int lines = 0;
  for (std::string line; std::getline(in, line);) ++lines;
  CHECK(lines == 3);
  auto status = c.job({"status", "1", "--json"});
  CHECK(status.output.find("\"SUCCEEDED\"") != std::string::npos);
}


TEST_CASE("a GRPO job whose first attempt fails after a checkpoint resumes from it in its second attempt") {
  test_support::TempDir dir("troupe-grpo-job");
  itest::Cluster c("CPU=4");
  const std::string bin = std::filesystem::path(TROUPE_GRPO).parent_path().string();
  const std::string run_dir = dir.path + "/run";
  // Attempt 1 checkpoints after 2 of 4 steps and then fails; attempt 2 is the same command.
  const std::string grpo = "./grpo --steps 4 --sft-steps 20 --heldout-size 50 --train-size 200 --prompts 8 "
                           "--eval-every 2 --checkpoint-every 2 --run-dir " + run_dir;
  auto r = c.job({"submit", "--working-dir", bin, "--max-attempts", "2", "--", "sh", "-c",
                  "if [ \"$TROUPE_JOB_ATTEMPT\" = 1 ]; then " + grpo + " --stop-after 2; exit 3; fi; exec " + grpo},
                 std::chrono::seconds(170));
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK(r.output.find("attempt 2 of job 1: resuming from the newest checkpoint") != std::string::npos);
  CHECK(r.output.find("\"resumed\":true") != std::string::npos);
  auto status = c.job({"status", "1", "--json"});
  CHECK(status.output.find("\"attempts\": 2") != std::string::npos);
  CHECK(status.output.find("\"SUCCEEDED\"") != std::string::npos);
  std::ifstream in(std::filesystem::path(run_dir) / "metrics.jsonl");
  std::vector<int> steps;
  for (std::string line; std::getline(in, line);) steps.push_back(nlohmann::json::parse(line).value("step", -1));
  CHECK(steps == std::vector<int>{1, 2, 3, 4});   // the resumed attempt added steps 3 and 4, none twice
}
