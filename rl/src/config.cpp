#include "troupe/rl/config.hpp"

#include <toml++/toml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <iostream>
#include <limits>
#include <sstream>
#include <stdexcept>

namespace troupe::rl {

static_assert(std::is_same_v<std::size_t, std::uint64_t>, "ConfigSchema::Field binds size_t fields as uint64_t");

namespace {

std::string where(const toml::source_region& r, const std::string& fallback) {
  const std::string file = r.path ? std::string(*r.path) : fallback;
  return file + ":" + std::to_string(r.begin.line);
}

template <class Int>
void put_int(Int* field, std::int64_t v, const std::string& key, const std::string& at) {
  if (v < std::int64_t(std::numeric_limits<Int>::min()) ||
      (v > 0 && std::uint64_t(v) > std::uint64_t(std::numeric_limits<Int>::max()))) {
    throw std::invalid_argument(at + ": " + key + " = " + std::to_string(v) + " is out of range");
  }
  *field = Int(v);
}

// Stores `node` into `field`, or throws naming the key and where it was written.
void assign(const ConfigSchema::Field& field, const toml::node& node, const std::string& key, const std::string& at) {
  auto wrong = [&](const char* want) {
    return std::invalid_argument(at + ": " + key + " must be " + want + ", not a " +
                                 std::string(toml::impl::node_type_friendly_names[size_t(node.type())]));
  };
  std::visit(
      [&](auto* f) {
        using T = std::remove_pointer_t<decltype(f)>;
        if constexpr (std::is_same_v<T, std::string>) {
          if (!node.is_string()) throw wrong("a string");
          *f = node.as_string()->get();
        } else if constexpr (std::is_same_v<T, bool>) {
          if (!node.is_boolean()) throw wrong("true or false");
          *f = node.as_boolean()->get();
        } else if constexpr (std::is_floating_point_v<T>) {
          if (node.is_floating_point()) *f = T(node.as_floating_point()->get());
          else if (node.is_integer()) *f = T(node.as_integer()->get());
          else throw wrong("a number");
        } else {
          if (!node.is_integer()) throw wrong("an integer");
          put_int(f, node.as_integer()->get(), key, at);
        }
      },
      field);
}

void walk(const toml::table& table, const std::string& prefix, const std::string& source,
          const std::function<void(const std::string&, const toml::node&, const std::string&)>& leaf) {
  for (const auto& [k, node] : table) {
    const std::string key = prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
    if (const auto* sub = node.as_table()) walk(*sub, key, source, leaf);
    else leaf(key, node, where(node.source(), source));
  }
}

std::string render(const ConfigSchema::Field& field) {
  return std::visit(
      [](auto* f) -> std::string {
        using T = std::remove_pointer_t<decltype(f)>;
        std::ostringstream out;
        if constexpr (std::is_same_v<T, std::string>) {
          out << toml::value<std::string>(*f);
        } else if constexpr (std::is_same_v<T, bool>) {
          out << (*f ? "true" : "false");
        } else if constexpr (std::is_floating_point_v<T>) {
          char buf[64];
          const auto r = std::to_chars(buf, buf + sizeof buf, *f);   // the shortest text that reads back exact
          std::string s(buf, r.ptr);
          if (s.find_first_of(".eEn") == std::string::npos) s += ".0";   // a TOML float, not an integer (inf, nan pass)
          return s;
        } else {
          out << *f;
        }
        return out.str();
      },
      field);
}

}  // namespace

void ConfigSchema::add(std::string key, Field field, std::string doc) {
  if (key.find('.') == std::string::npos) throw std::logic_error("config key '" + key + "' has no part");
  entries_.push_back(Entry{std::move(key), std::move(doc), field});
}

const ConfigSchema::Entry* ConfigSchema::find(const std::string& key) const {
  for (const auto& e : entries_) {
    if (e.key == key) return &e;
  }
  return nullptr;
}

std::vector<std::string> ConfigSchema::keys() const {
  std::vector<std::string> out;
  for (const auto& e : entries_) out.push_back(e.key);
  return out;
}

void ConfigSchema::load_string(const std::string& text, const std::string& source) {
  toml::table table;
  try {
    table = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    throw std::invalid_argument(where(e.source(), source) + ": " + std::string(e.description()));
  }
  walk(table, "", source, [&](const std::string& key, const toml::node& node, const std::string& at) {
    const Entry* e = find(key);
    if (e == nullptr) throw std::invalid_argument(at + ": unknown key '" + key + "'");
    assign(e->field, node, key, at);
  });
}

void ConfigSchema::load_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::invalid_argument("cannot read the configuration file " + path);
  std::stringstream text;
  text << in.rdbuf();
  load_string(text.str(), path);
}

void ConfigSchema::set(const std::string& assignment) {
  const auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0) throw std::invalid_argument("--set " + assignment + ": expected key=value");
  const std::string key = assignment.substr(0, eq), value = assignment.substr(eq + 1);
  const Entry* e = find(key);
  if (e == nullptr) throw std::invalid_argument("--set: unknown key '" + key + "'");
  const std::string at = "--set " + key;
  toml::table parsed;
  try {
    parsed = toml::parse("v = " + value, at);
  } catch (const toml::parse_error&) {
    if (!std::holds_alternative<std::string*>(e->field)) throw std::invalid_argument(at + ": '" + value + "' is no value");
    *std::get<std::string*>(e->field) = value;   // a bare string
    return;
  }
  const toml::node& v = *parsed.get("v");
  if (std::holds_alternative<std::string*>(e->field) && !v.is_string()) {   // 2, 2024, true: a string key's bare text
    *std::get<std::string*>(e->field) = value;
    return;
  }
  assign(e->field, v, key, at);
}

void ConfigSchema::set_text(const std::string& key, const std::string& value) {
  const Entry* e = find(key);
  if (e != nullptr && std::holds_alternative<std::string*>(e->field)) *std::get<std::string*>(e->field) = value;
  else set(key + "=" + value);   // an unknown key is refused there, by name
}

std::string ConfigSchema::to_toml() const {
  std::ostringstream out;
  std::string part;
  for (const auto& e : entries_) {
    const auto dot = e.key.find('.');
    const std::string p = e.key.substr(0, dot), name = e.key.substr(dot + 1);
    if (p != part) {
      out << (part.empty() ? "" : "\n") << "[" << p << "]\n";
      part = p;
    }
    if (!e.doc.empty()) out << "# " << e.doc << "\n";
    out << name << " = " << render(e.field) << "\n";
  }
  return out.str();
}

bool is_runtime_flag(const std::string& arg) {
  const std::string name = arg.substr(0, arg.find('='));
  return name == "--address" || name.rfind("--troupe-", 0) == 0;
}

void apply_command_line(ConfigSchema& schema, int argc, const char* const* argv) {
  std::string file;
  std::vector<std::string> sets;
  bool have_file = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool config = a == "--config" || a.rfind("--config=", 0) == 0;
    if ((a == "--config" || a == "--set") && i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
    if (config && have_file) throw std::invalid_argument("--config is given twice (one file; --set KEY=VALUE for more keys)");
    have_file = have_file || config;
    if (a == "--config" || a == "--set") (a == "--config" ? file : sets.emplace_back()) = argv[++i];
    else if (a.rfind("--config=", 0) == 0) file = a.substr(9);
    else if (a.rfind("--set=", 0) == 0) sets.push_back(a.substr(6));
  }
  if (!file.empty()) schema.load_file(file);
  for (const auto& s : sets) schema.set(s);
}

void apply_program_command_line(ConfigSchema& schema, int argc, const char* const* argv,
                                const std::map<std::string, std::string>& flags) {
  std::vector<std::pair<std::string, std::string>> given;   // (key, value) of the program's flags
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--config" || a == "--set" || is_runtime_flag(a)) {   // a value follows
      if (a.find('=') == std::string::npos) ++i;
      continue;
    }
    if (a.rfind("--config=", 0) == 0 || a.rfind("--set=", 0) == 0) continue;
    const auto eq = a.find('=');
    const std::string name = a.substr(0, eq);
    auto it = flags.find(name);
    if (it == flags.end()) throw std::invalid_argument("unknown argument '" + a + "' (use --config FILE or --set KEY=VALUE)");
    if (eq != std::string::npos) given.emplace_back(it->second, a.substr(eq + 1));
    else if (i + 1 < argc) given.emplace_back(it->second, argv[++i]);
    else throw std::invalid_argument(name + " needs a value");
  }
  apply_command_line(schema, argc, argv);
  for (const auto& [key, value] : given) schema.set_text(key, value);
}

bool parse_program_command_line(const std::string& program, ConfigSchema& schema, int argc, const char* const* argv,
                                const std::map<std::string, std::string>& flags) {
  std::vector<const char*> rest{argc > 0 ? argv[0] : program.c_str()};
  bool help = false, print = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--print-config") { print = true; continue; }
    if (a == "--help" || a == "-h") help = true;
    rest.push_back(argv[i]);
    // A value is never read as --help or --print-config (`--run-dir --help` names a directory).
    const bool takes_value = a.find('=') == std::string::npos &&
                             (a == "--config" || a == "--set" || is_runtime_flag(a) || flags.count(a) > 0);
    if (takes_value && i + 1 < argc) rest.push_back(argv[++i]);
  }
  if (help) {
    std::vector<std::pair<std::string, std::string>> lines{
        {"--config FILE", "a TOML configuration; keys it leaves out keep this program's demo values (examples/configs/" + program + ".toml has every key)"},
        {"--set KEY=VALUE", "one key, e.g. run.seed=2 (repeatable; over the file's)"},
        {"--print-config", "print the resolved configuration (TOML, every key described) and exit"}};
    for (const auto& [flag, key] : flags) lines.emplace_back(flag + " VALUE", "sets " + key);
    lines.emplace_back("--troupe-* VALUE", "the runtime's own flags (README, \"Runtime settings\")");
    std::size_t width = 0;
    for (const auto& l : lines) width = std::max(width, l.first.size());
    std::cout << "Usage: " << program << " [--config FILE] [--set KEY=VALUE]... [--print-config] [FLAG VALUE]...\n";
    for (const auto& [left, what] : lines) std::cout << "  " << left << std::string(width + 2 - left.size(), ' ') << what << "\n";
    return false;
  }
  apply_program_command_line(schema, int(rest.size()), rest.data(), flags);
  if (print) {
    std::cout << "# build/bin/" << program << "'s configuration (" << program << " --print-config); run it with " << program
              << " --config FILE\n"
              << schema.to_toml();
    return false;
  }
  return true;
}

std::map<std::string, std::string> common_program_flags() {
  return {{"--seed", "run.seed"}, {"--steps", "algo.steps"}, {"--run-dir", "run.run_dir"},
          {"--reward", "algo.reward"}, {"--rollouts", "placement.rollouts"}};
}

ConfigSchema run_config_schema(RunConfig& c) {
  ConfigSchema s;
  s.add("task.spec", &c.task.spec, "the verifiable task, e.g. addition:1-3 (operands of 1 to 3 digits)");
  s.add("task.train_size", &c.task.train_size, "train problems");
  s.add("task.heldout_size", &c.task.heldout_size, "held-out problems (accuracy is measured on them)");
  s.add("task.heldout_kind_share", &c.task.heldout_kind_share,
        "the held-out set takes at most this share of each kind of problem (addition: the operands' digit counts), so every kind stays in training; 1: no bound");
  s.add("model.architecture", &c.model.policy.architecture, "the model, by name: transformer (the sizes below), or one the program registers with TROUPE_MODEL");
  s.add("model.context", &c.model.policy.context, "longest sequence, prompt and answer");
  s.add("model.layers", &c.model.policy.layers, "transformer layers");
  s.add("model.d_model", &c.model.policy.d_model, "transformer width");
  s.add("model.heads", &c.model.policy.heads, "attention heads (divides d_model)");
  s.add("model.d_ff", &c.model.policy.d_ff, "feed-forward width; 0: 4 * d_model");
  s.add("model.init_weights", &c.model.init_weights, "a policy's safetensors to start from (another run's sft.safetensors); empty: the seed's initial weights");
  s.add("algo.sft_steps", &c.algo.sft.steps, "supervised warm-start steps (the least, with sft_target_nll); 0 skips it");
  s.add("algo.sft_target_nll", &c.algo.sft.target_nll, "after sft_steps, the warm start goes on while its train loss (nats an answer token, a 20-step moving average) is above this; 0: no more steps");
  s.add("algo.sft_max_steps", &c.algo.sft.max_steps, "with sft_target_nll: the warm start's most steps");
  s.add("algo.sft_stop_nll", &c.algo.sft.stop_nll, "the warm start ends as soon as its train loss (the same average) falls to this, before sft_steps too; 0: never early");
  s.add("algo.sft_batch_size", &c.algo.sft.batch_size, "warm-start batch");
  s.add("algo.sft_lr", &c.algo.sft.optim.lr, "warm-start learning rate");
  s.add("algo.sft_warmup_steps", &c.algo.sft.optim.warmup_steps, "warm-start learning-rate warm-up");
  s.add("algo.steps", &c.algo.steps, "RL steps");
  s.add("algo.prompts_per_step", &c.algo.prompts_per_step, "prompts per step");
  s.add("algo.group_size", &c.algo.group_size, "samples per prompt (G)");
  s.add("algo.temperature", &c.algo.temperature, "sampling temperature");
  s.add("algo.top_p", &c.algo.top_p, "nucleus sampling");
  s.add("algo.lr", &c.algo.optim.lr, "RL learning rate");
  s.add("algo.max_grad_norm", &c.algo.optim.max_grad_norm, "global gradient-norm clip; <= 0: none");
  s.add("algo.name", &c.algo.name, "the algorithm: grpo, ppo (a critic and GAE), dpo (preference pairs of the policy's samples), or the program's own");
  s.add("algo.dpo_beta", &c.algo.dpo_beta, "DPO's beta");
  s.add("algo.dpo_round_steps", &c.algo.dpo_round_steps, "DPO: new pairs from the current policy every this many steps (1: online; = steps: offline)");
  s.add("algo.gae_gamma", &c.algo.gae_gamma, "PPO: GAE's discount");
  s.add("algo.gae_lambda", &c.algo.gae_lambda, "PPO: GAE's lambda");
  s.add("algo.value_clip", &c.algo.value_clip, "PPO: the critic's value-loss clip");
  s.add("algo.critic_lr", &c.algo.critic_optim.lr, "PPO: the critic's learning rate");
  s.add("algo.critic_init", &c.algo.critic_init, "PPO: empty, the critic starts from the SFT trunk; or a reward model's file (its trunk and score head)");
  s.add("algo.kl_target", &c.algo.kl_target, "PPO: the adaptive KL controller's target (nats per sample); <= 0: kl_coef stays fixed");
  s.add("algo.kl_horizon", &c.algo.kl_horizon, "PPO: the adaptive KL controller's horizon (samples)");
  s.add("algo.mini_batches", &c.algo.mini_batches, "PPO: optimizer steps per epoch over the batch (updates_per_batch epochs)");
  s.add("algo.dpo_ipo", &c.algo.dpo_ipo, "IPO's loss instead of DPO's");
  s.add("algo.advantage", &c.algo.advantage, "advantage estimator: grpo, rloo, reinforce++, reinforce++_baseline, or the program's own");
  s.add("algo.reward", &c.algo.reward, "the samples' reward backend: rule (the task's verifier), model:PATH (build/bin/reward_model's file), or one the program registers");
  s.add("algo.objective", &c.algo.objective, "the trainer's objective: grpo, or the program's own");
  s.add("algo.clip_eps", &c.algo.clip_eps, "ratio clip epsilon");
  s.add("algo.kl_coef", &c.algo.kl_coef, "KL coefficient (beta)");
  s.add("algo.updates_per_batch", &c.algo.updates_per_batch, "optimizer steps per batch of samples (mu)");
  s.add("algo.micro_batches", &c.algo.micro_batches, "gradient accumulation parts");
  s.add("algo.skip_zero_advantage", &c.algo.skip_zero_advantage, "GRPO with kl_coef 0: leave groups whose advantages are all 0 out of the update (no gradient: the same update, less work)");
  s.add("run.seed", &c.run.seed, "run seed: data order, sampling and initial weights");
  s.add("run.eval_every", &c.run.eval_every, "held-out evaluation period in steps; 0: at the start and the end");
  s.add("run.checkpoint_every", &c.run.checkpoint_every, "checkpoint period in steps; 0: at the end");
  s.add("run.run_dir", &c.run.run_dir, "output directory: metrics, plot, checkpoints, this configuration");
  s.add("run.resume", &c.run.resume, "continue from the newest checkpoint in run_dir");
  s.add("run.stop_after", &c.run.stop_after, ">= 0: checkpoint and stop after this many steps");
  s.add("run.verbose", &c.run.verbose, "progress on stderr");
  s.add("placement.worker_processes", &c.placement.worker_processes,
        "trainer, rollout and reference in one worker process, a critic or reward model in one each, the rule verifier in the driver's");
  s.add("placement.verifier_process", &c.placement.verifier_process,
        "with worker_processes: the rule verifier in a worker process of its own");
  s.add("placement.share_threads", &c.placement.share_threads,
        "with worker_processes: the trainer's worker runs each call of a step on whichever of its roles' threads is awake");
  s.add("placement.rollouts", &c.placement.rollouts,
        "rollout engines MIN:MAX: engine 0 beside the trainer, the others an elastic group in worker processes");
  s.add("placement.trainer_threads", &c.placement.trainer_threads, "libtorch intra-op threads of the trainer");
  s.add("placement.rollout_threads", &c.placement.rollout_threads, "of the rollout engine");
  s.add("placement.reference_threads", &c.placement.reference_threads, "of the reference");
  s.add("placement.blas_threads", &c.placement.blas_threads,
        "OpenBLAS threads of this process while the run lasts; 0: every core (one actor computes at a time); 1: actors compute side by side (PPO)");
  return s;
}

}  // namespace troupe::rl
