// Run configuration as files: a program's settings are named keys ("algo.kl_coef") bound to the
// fields of its configuration struct, read from a TOML file (toml++), set one by one from the
// command line ("--set algo.kl_coef=0.02"), and written back resolved (the run dir keeps it next to
// the metrics). Keys a file does not name keep the values the struct had: the program's demo
// configuration. Torch-free.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "troupe/rl/run.hpp"

namespace troupe::rl {

class ConfigSchema {
 public:
  // (std::size_t is std::uint64_t here.)
  using Field = std::variant<std::string*, bool*, std::int32_t*, std::int64_t*, std::uint64_t*, float*, double*>;

  // Binds `key` (dotted: "part.name") to `field`; `doc` is written above it by to_toml().
  void add(std::string key, Field field, std::string doc);

  // Applies a TOML document. An unknown key, a value of the wrong type or out of the field's
  // range, or a syntax error is a std::invalid_argument naming the key and source:line; fields
  // already applied before the error keep their new values.
  void load_file(const std::string& path);
  void load_string(const std::string& text, const std::string& source = "<string>");
  // "key=value" with the value in TOML syntax; a string may also be given bare ("task.spec=addition:1-2").
  void set(const std::string& assignment);
  // A flag's value for `key`: a string key takes the text as it is (a run dir named "2024" stays a
  // string), any other key parses it as a TOML value. Throws as set does.
  void set_text(const std::string& key, const std::string& value);
  // Every key with its current value, grouped by part, in the order added: a TOML document that
  // load_string() reads back to the same values.
  std::string to_toml() const;
  std::vector<std::string> keys() const;

 private:
  struct Entry {
    std::string key, doc;
    Field field;
  };
  const Entry* find(const std::string& key) const;
  std::vector<Entry> entries_;
};

// RunConfig's keys, in five parts: task.*, model.*, algo.* (SFT and the algorithm), run.*, placement.*.
ConfigSchema run_config_schema(RunConfig& config);

// Whether `arg` names one of the runtime's flags (troupe::init reads them: --address, --troupe-*),
// each of which takes a value: the next argument, unless given as --flag=VALUE. A program's own
// parser passes them by.
bool is_runtime_flag(const std::string& arg);

// A program's command line applied to `schema`: "--config FILE" first, then each "--set KEY=VALUE"
// in order (also "--config=FILE", "--set=KEY=VALUE"); other arguments are left for the program.
// Throws std::invalid_argument as load_file and set do, and for a second --config or a --config or
// --set with no value after it.
void apply_command_line(ConfigSchema& schema, int argc, const char* const* argv);

// The whole command line of a program with no flags of its own: --config and --set as above,
// each `flags` entry ("--critic-init" -> "algo.critic_init") as `--flag VALUE` setting that key
// (after the --set keys), the runtime's --troupe-* flags left alone. Any other argument is an
// error naming it (std::invalid_argument), so a mistyped flag never passes silently.
void apply_program_command_line(ConfigSchema& schema, int argc, const char* const* argv,
                                const std::map<std::string, std::string>& flags);
// A whole RL program's command line (ppo, dpo, rloo, or a user's): apply_program_command_line,
// plus --help (usage on stdout) and --print-config (the resolved configuration as TOML, every key
// described: what examples/configs/<program>.toml ships). Returns false once it printed one of
// them (the program then exits with status 0), true when the program should run. Errors as
// apply_program_command_line (std::invalid_argument).
bool parse_program_command_line(const std::string& program, ConfigSchema& schema, int argc, const char* const* argv,
                                const std::map<std::string, std::string>& flags);
// The flags the RL programs share: --seed, --steps, --run-dir, --reward, --rollouts.
std::map<std::string, std::string> common_program_flags();

}  // namespace troupe::rl
