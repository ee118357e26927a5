// Run configuration files: keys bound to RunConfig, read from TOML, set from the command line,
// written back; errors name the key and the line. The shipped demo file is the demo configuration.
#include "troupe/rl/config.hpp"
#include "troupe/rl/run.hpp"

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <doctest/doctest.h>

using troupe::rl::RunConfig;
using troupe::rl::run_config_schema;

namespace {

std::string refusal(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(accepted)";
}

}  // namespace

TEST_CASE("a config file sets the keys it names, the others keep the demo's values") {
  auto c = RunConfig::demo();
  auto schema = run_config_schema(c);
  schema.load_string("[algo]\nkl_coef = 0.02\ngroup_size = 4\n[task]\nspec = \"addition:1-3\"\n[run]\nresume = true\n"
                     "[model]\nlayers = 3\n[placement]\nworker_processes = true\n", "run.toml");
  CHECK(c.algo.kl_coef == doctest::Approx(0.02));
  CHECK(c.algo.group_size == 4);
  CHECK(c.task.spec == "addition:1-3");
  CHECK(c.run.resume);
  CHECK(c.model.policy.layers == 3);
  CHECK(c.placement.worker_processes);
  const auto demo = RunConfig::demo();
  CHECK(c.algo.steps == demo.algo.steps);   // not named: the demo's
  CHECK(c.algo.optim.lr == doctest::Approx(demo.algo.optim.lr));
  schema.load_string("algo.lr = 1\n");   // dotted keys; an integer for a float field
  CHECK(c.algo.optim.lr == doctest::Approx(1.0));
}

TEST_CASE("--set takes one key in TOML syntax, a bare string too") {
  auto c = RunConfig::demo();
  auto schema = run_config_schema(c);
  schema.set("algo.kl_coef=0.5");
  schema.set("task.spec=addition:2-2");
  schema.set("run.run_dir=\"runs/x y\"");
  schema.set("run.verbose=false");
  CHECK(c.algo.kl_coef == doctest::Approx(0.5));
  CHECK(c.task.spec == "addition:2-2");
  CHECK(c.run.run_dir == "runs/x y");
  CHECK_FALSE(c.run.verbose);
  CHECK(refusal([&] { schema.set("algo.nope=1"); }).find("unknown key 'algo.nope'") != std::string::npos);
  CHECK(refusal([&] { schema.set("algo.group_size=many"); }).find("algo.group_size") != std::string::npos);
  CHECK(refusal([&] { schema.set("algo.group_size"); }).find("key=value") != std::string::npos);
  // A string key takes text that reads as another TOML type as that text, as its flag does.
  schema.set("placement.rollouts=2");
  schema.set("run.run_dir=2024");
  CHECK(c.placement.rollouts == "2");
  CHECK(c.run.run_dir == "2024");
  // A --set or --config with nothing after it, or a second --config, is refused, not skipped.
  const char* dangling[] = {"grpo", "--set"};
  CHECK(refusal([&] { troupe::rl::apply_command_line(schema, 2, dangling); }).find("--set needs a value") != std::string::npos);
  const char* twice[] = {"grpo", "--config", "a.toml", "--config=b.toml"};
  CHECK(refusal([&] { troupe::rl::apply_command_line(schema, 4, twice); }).find("twice") != std::string::npos);
}

TEST_CASE("an unknown key, a wrong type, a value out of range or bad syntax is refused, naming the key and the line") {
  auto c = RunConfig::demo();
  auto schema = run_config_schema(c);
  const auto unknown = refusal([&] { schema.load_string("[algo]\nkl_coef = 0.1\nkl_coeff = 0.2\n", "run.toml"); });
  CHECK(unknown.find("run.toml:3") != std::string::npos);
  CHECK(unknown.find("algo.kl_coeff") != std::string::npos);
  const auto wrong = refusal([&] { schema.load_string("[algo]\n\ngroup_size = \"eight\"\n", "run.toml"); });
  CHECK(wrong.find("run.toml:3") != std::string::npos);
  CHECK(wrong.find("algo.group_size must be an integer") != std::string::npos);
  CHECK(refusal([&] { schema.load_string("[run]\nseed = -1\n", "run.toml"); }).find("out of range") != std::string::npos);
  CHECK(refusal([&] { schema.load_string("[algo\nsteps = 1\n", "run.toml"); }).find("run.toml:1") != std::string::npos);
  CHECK(refusal([&] { schema.load_file("/nonexistent/run.toml"); }).find("cannot read") != std::string::npos);
}

TEST_CASE("the written configuration reads back to the same values, and the shipped demo file is the demo") {
  auto c = RunConfig::demo();
  c.algo.kl_coef = 0.0123;
  c.algo.temperature = 0.7f;
  c.task.spec = "addition:1-3";
  const std::string text = run_config_schema(c).to_toml();
  RunConfig back;   // not the demo: every key must come from the text
  run_config_schema(back).load_string(text);
  CHECK(run_config_schema(back).to_toml() == text);
  CHECK(back.algo.kl_coef == c.algo.kl_coef);
  CHECK(back.algo.temperature == c.algo.temperature);
  auto demo = RunConfig::demo();
  std::ifstream shipped(TROUPE_SOURCE_DIR "/examples/configs/grpo.toml");
  REQUIRE(shipped);
  std::string file, line;
  while (std::getline(shipped, line)) {
    if (file.empty() && line.rfind('#', 0) == 0) continue;   // the file's own heading
    file += line + "\n";
  }
  CHECK(file == run_config_schema(demo).to_toml());   // if the demo changes: grpo --print-config > that file
}

TEST_CASE("a job's later attempt resumes from the newest checkpoint, its first attempt and a plain run do not") {
  troupe::rl::RunConfig c;
  ::unsetenv("TROUPE_JOB_ATTEMPT");
  CHECK_FALSE(troupe::rl::for_job_attempt(c).run.resume);
  ::setenv("TROUPE_JOB_ATTEMPT", "1", 1);
  CHECK_FALSE(troupe::rl::for_job_attempt(c).run.resume);
  ::setenv("TROUPE_JOB_ATTEMPT", "2", 1);
  CHECK(troupe::rl::for_job_attempt(c).run.resume);
  ::unsetenv("TROUPE_JOB_ATTEMPT");
}

TEST_CASE("a program's command line: its flags set their keys, --troupe-* flags pass, anything else is refused by name") {
  auto c = RunConfig::demo();
  auto schema = run_config_schema(c);
  const char* argv[] = {"ppo", "--troupe-log-level", "warn", "--set", "algo.kl_coef=0.5", "--seed", "7",
                        "--critic-init=/x/rm.safetensors", "--address", "127.0.0.1:1"};
  apply_program_command_line(schema, 10, argv, {{"--seed", "run.seed"}, {"--critic-init", "algo.critic_init"}});
  CHECK(c.run.seed == 7);
  CHECK(c.algo.critic_init == "/x/rm.safetensors");
  CHECK(c.algo.kl_coef == doctest::Approx(0.5));
  const char* bad[] = {"ppo", "--stpes", "3"};
  try {
    apply_program_command_line(schema, 3, bad, {{"--steps", "algo.steps"}});
    FAIL("a mistyped flag was accepted");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()).find("--stpes") != std::string::npos);
  }
  const char* dangling[] = {"ppo", "--steps"};
  CHECK_THROWS_AS(apply_program_command_line(schema, 2, dangling, {{"--steps", "algo.steps"}}), std::invalid_argument);
  // A flag's value is taken by its key's type: a run dir that reads as a number stays text.
  const char* numeric_dir[] = {"dpo", "--run-dir", "2024", "--rollouts", "1:3", "--steps", "12"};
  apply_program_command_line(schema, 7, numeric_dir, troupe::rl::common_program_flags());
  CHECK(c.run.run_dir == "2024");
  CHECK(c.placement.rollouts == "1:3");
  CHECK(c.algo.steps == 12);
  const char* not_a_number[] = {"dpo", "--steps", "many"};
  CHECK_THROWS_AS(apply_program_command_line(schema, 3, not_a_number, troupe::rl::common_program_flags()), std::invalid_argument);
}

TEST_CASE("a program's whole command line: --help and --print-config print and stop the program, a flag's value is only a value") {
  using troupe::rl::parse_program_command_line;
  auto flags = troupe::rl::common_program_flags();
  auto c = RunConfig::demo();
  auto schema = run_config_schema(c);
  const char* run[] = {"dpo", "--seed", "3", "--set", "algo.dpo_beta=0.2"};
  CHECK(parse_program_command_line("dpo", schema, 5, run, flags));
  CHECK(c.run.seed == 3);
  CHECK(c.algo.dpo_beta == doctest::Approx(0.2));
  const char* help[] = {"dpo", "--steps", "5", "--help"};
  CHECK_FALSE(parse_program_command_line("dpo", schema, 4, help, flags));
  CHECK(c.algo.steps == RunConfig::demo().algo.steps);   // help applies nothing
  const char* print[] = {"dpo", "--print-config", "--steps", "9"};
  CHECK_FALSE(parse_program_command_line("dpo", schema, 4, print, flags));
  CHECK(c.algo.steps == 9);   // printed as resolved
  const char* dir_named_help[] = {"dpo", "--run-dir", "--help"};
  CHECK(parse_program_command_line("dpo", schema, 3, dir_named_help, flags));
  CHECK(c.run.run_dir == "--help");
  const char* bad[] = {"dpo", "--print-config", "--no-such-flag", "1"};
  CHECK_THROWS_AS(parse_program_command_line("dpo", schema, 4, bad, flags), std::invalid_argument);
}
