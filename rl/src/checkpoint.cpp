#include "troupe/rl/checkpoint.hpp"

#include <charconv>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace troupe::rl {
namespace fs = std::filesystem;

std::string checkpoint_dir(const std::string& run_dir, std::int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%06lld", static_cast<long long>(step));
  return (fs::path(run_dir) / "checkpoints" / name).string();
}

std::optional<std::string> latest_checkpoint(const std::string& run_dir) {
  const fs::path root = fs::path(run_dir) / "checkpoints";
  if (!fs::is_directory(root)) return std::nullopt;
  std::optional<std::string> best;
  std::int64_t best_step = -1;
  for (auto& entry : fs::directory_iterator(root)) {
    const auto name = entry.path().filename().string();
    if (name.rfind("step-", 0) != 0) continue;
    std::int64_t step = -1;   // by number: step-1000000 is newer than step-999999
    const char* digits = name.data() + 5;
    const auto [end, ec] = std::from_chars(digits, name.data() + name.size(), step);
    if (ec != std::errc{} || end != name.data() + name.size() || end == digits) continue;   // staging dirs: step-N.tmp...
    if (!fs::exists(entry.path() / "state.json")) continue;
    if (step > best_step) best_step = step, best = entry.path().string();
  }
  return best;
}

void save_run_state(const std::string& dir, const RunState& s) {
  nlohmann::ordered_json j;
  j["step"] = s.step;
  j["policy_version"] = s.policy_version;
  j["seed"] = s.seed;
  j["cursor"] = {{"seed", s.cursor.seed}, {"epoch", s.cursor.epoch}, {"index", s.cursor.index}};
  j["data"] = s.data;
  j["sft_heldout_acc"] = s.sft_heldout_acc;
  j["sft_heldout_format"] = s.sft_heldout_format;
  j["sft_heldout_acc_by_kind"] = s.sft_heldout_acc_by_kind;
  j["sft_steps"] = s.sft_steps;
  j["values"] = s.values;
  std::ofstream out(dir + "/state.json");
  out << j.dump(2) << "\n";
  if (!out) throw std::runtime_error("cannot write " + dir + "/state.json");
}

RunState load_run_state(const std::string& dir) {
  std::ifstream in(dir + "/state.json");
  if (!in) throw std::runtime_error("cannot read " + dir + "/state.json");
  try {
    auto j = nlohmann::json::parse(in);
    RunState s;
    s.step = j.at("step").get<std::int64_t>();
    s.policy_version = j.at("policy_version").get<std::int64_t>();
    s.seed = j.at("seed").get<std::uint64_t>();
    s.cursor.seed = j.at("cursor").at("seed").get<std::uint64_t>();
    s.cursor.epoch = j.at("cursor").at("epoch").get<std::int64_t>();
    s.cursor.index = j.at("cursor").at("index").get<std::int64_t>();
    s.sft_heldout_acc = j.at("sft_heldout_acc").get<double>();
    s.sft_heldout_format = j.at("sft_heldout_format").get<double>();
    if (j.contains("sft_heldout_acc_by_kind"))   // older checkpoints have none
      s.sft_heldout_acc_by_kind = j.at("sft_heldout_acc_by_kind").get<std::map<std::string, double>>();
    if (j.contains("sft_steps")) s.sft_steps = j.at("sft_steps").get<std::int64_t>();   // nor this
    if (j.contains("data")) s.data = j.at("data").get<std::string>();   // nor this
    if (j.contains("values")) s.values = j.at("values").get<std::map<std::string, double>>();   // older checkpoints have none
    return s;
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(dir + "/state.json: " + e.what());
  }
}

void publish_checkpoint(const std::string& staging, const std::string& final_dir) {
  std::error_code ec;
  fs::remove_all(final_dir, ec);
  fs::rename(staging, final_dir);
}

}  // namespace troupe::rl
