#include "troupe/rl/metrics.hpp"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

namespace troupe::rl {
namespace {

using Json = nlohmann::ordered_json;

double rounded(double v, double scale = 1e6) { return std::round(v * scale) / scale + 0.0; }   // + 0.0: no "-0"

// A named-scalars field ("values", "heldout_acc_by_kind"): written only when it has entries, read
// back keeping the numbers.
void put_scalars(Json& j, const char* key, const std::map<std::string, double>& m) {
  if (m.empty()) return;
  Json o = Json::object();
  for (const auto& [k, v] : m) o[k] = rounded(v);
  j[key] = std::move(o);
}

std::map<std::string, double> get_scalars(const Json& j, const char* key) {
  std::map<std::string, double> m;
  if (auto it = j.find(key); it != j.end() && it->is_object()) {
    for (const auto& [k, v] : it->items()) {
      if (v.is_number()) m[k] = v.get<double>();
    }
  }
  return m;
}

}  // namespace

std::string to_json_line(const StepRecord& r) {
  Json j;
  j["step"] = r.step;
  j["policy_version"] = r.policy_version;
  j["sample_version"] = r.sample_version;
  j["reward_mean"] = rounded(r.reward_mean);
  j["reward_std"] = rounded(r.reward_std);
  j["format_ok"] = rounded(r.format_ok);
  j["response_tokens"] = rounded(r.response_tokens);
  if (r.heldout_acc) j["heldout_acc"] = rounded(*r.heldout_acc);
  if (r.heldout_format) j["heldout_format"] = rounded(*r.heldout_format);
  put_scalars(j, "heldout_acc_by_kind", r.heldout_acc_by_kind);
  j["loss"] = rounded(r.loss);
  j["pg_loss"] = rounded(r.pg_loss);
  j["kl"] = rounded(r.kl, 1e9);
  j["entropy"] = rounded(r.entropy);
  j["clip_fraction"] = rounded(r.clip_fraction);
  j["grad_norm"] = rounded(r.grad_norm);
  j["lr"] = r.lr;
  j["tokens_per_s"] = rounded(r.tokens_per_s, 10);
  j["rollout_engines"] = r.rollout_engines;
  if (!r.samples_digest.empty()) j["samples_digest"] = r.samples_digest;
  const auto& s = r.seconds;
  j["seconds"] = {{"rollout", rounded(s.rollout)}, {"reward", rounded(s.reward)}, {"reference", rounded(s.reference)},
                  {"train", rounded(s.train)}, {"sync", rounded(s.sync)}, {"eval", rounded(s.eval)}, {"total", rounded(s.total)}};
  j["actor_seconds"] = {{"rollout", rounded(r.actor_seconds.rollout)}, {"train", rounded(r.actor_seconds.train)}};
  put_scalars(j, "values", r.values);
  return j.dump();
}

StepRecord record_from_json_line(const std::string& line) {
  auto j = Json::parse(line);
  StepRecord r;
  r.step = j.at("step").get<std::int64_t>();
  r.policy_version = j.value("policy_version", std::int64_t(0));
  r.sample_version = j.value("sample_version", std::int64_t(0));
  r.reward_mean = j.value("reward_mean", 0.0);
  r.reward_std = j.value("reward_std", 0.0);
  r.format_ok = j.value("format_ok", 0.0);
  if (j.contains("heldout_acc")) r.heldout_acc = j["heldout_acc"].get<double>();
  if (j.contains("heldout_format")) r.heldout_format = j["heldout_format"].get<double>();
  r.heldout_acc_by_kind = get_scalars(j, "heldout_acc_by_kind");
  r.kl = j.value("kl", 0.0);
  r.entropy = j.value("entropy", 0.0);
  r.rollout_engines = j.value("rollout_engines", 1);
  r.samples_digest = j.value("samples_digest", "");
  r.values = get_scalars(j, "values");
  return r;
}

MetricsLog::MetricsLog(std::string path, std::int64_t keep_up_to) : path_(std::move(path)) {
  std::vector<std::string> kept;
  if (keep_up_to >= 0) {
    std::ifstream in(path_);
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) if (!line.empty()) lines.push_back(line);
    for (std::size_t i = 0; i < lines.size(); ++i) {
      StepRecord r;
      try {
        r = record_from_json_line(lines[i]);
      } catch (const std::exception& e) {
        // The last line may be torn (the process died, or the disk filled, while writing it): its
        // step is redone after the checkpoint anyway. A bad line before it is a damaged file.
        if (i + 1 == lines.size()) break;
        throw std::runtime_error(path_ + " line " + std::to_string(i + 1) + ": " + e.what());
      }
      if (r.step <= keep_up_to) kept.push_back(lines[i]);
    }
  }
  // The kept lines go to a new file that then replaces the old one: a crash in between leaves one
  // or the other whole.
  const std::string fresh = path_ + ".tmp";
  {
    std::ofstream out(fresh, std::ios::trunc);
    for (auto& line : kept) out << line << "\n";
    out.flush();
    if (!out) throw std::runtime_error("cannot write metrics file " + fresh);
  }
  std::error_code ec;
  std::filesystem::rename(fresh, path_, ec);
  if (ec) throw std::runtime_error("cannot replace metrics file " + path_ + ": " + ec.message());
  out_.open(path_, std::ios::app);
  if (!out_) throw std::runtime_error("cannot open metrics file " + path_);
}

void MetricsLog::write(const StepRecord& r) {
  out_ << to_json_line(r) << "\n";
  out_.flush();
  if (!out_) throw std::runtime_error("cannot write metrics file " + path_ + " (step " + std::to_string(r.step) + ")");
}

std::vector<StepRecord> read_metrics(const std::string& path) {
  std::vector<StepRecord> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) if (!line.empty()) out.push_back(record_from_json_line(line));
  return out;
}

ProgressLine::ProgressLine(std::int64_t total_steps, std::int64_t every, bool enabled)
    : total_(total_steps), every_(every), enabled_(enabled), tty_(isatty(STDERR_FILENO) == 1) {}

void ProgressLine::update(const StepRecord& r, double elapsed_s) {
  if (!enabled_) return;
  char buf[256];
  std::snprintf(buf, sizeof buf, "step %4lld/%lld  reward %.3f  format %.2f  kl %.4f  entropy %.3f  %6.0f tok/s  %5.1f s",
                (long long)r.step, (long long)total_, r.reward_mean, r.format_ok, r.kl, r.entropy, r.tokens_per_s, elapsed_s);
  std::string line = buf;
  if (r.heldout_acc) {
    std::snprintf(buf, sizeof buf, "  held-out %.3f", *r.heldout_acc);
    line += buf;
  }
  if (tty_) {
    std::cerr << "\r\033[K" << line << std::flush;
    drawn_ = true;
  } else if (r.step % every_ == 0 || r.step == total_ || r.heldout_acc) {
    std::cerr << line << "\n";
  }
}

void ProgressLine::message(const std::string& text) {
  if (!enabled_) return;
  if (tty_ && drawn_) std::cerr << "\r\033[K";
  std::cerr << text << "\n";
  drawn_ = false;
}

void ProgressLine::finish() {
  if (tty_ && drawn_) std::cerr << "\n";
  drawn_ = false;
}

bool plot_metrics(const std::string& metrics_path, const std::string& png_path, const std::string& title,
                  std::optional<double> sft_heldout_acc, std::string* error) {
  // gnuplot's single-quoted strings double a quote; it runs with no shell (posix_spawnp), so a
  // path's characters are only characters.
  auto quoted = [](const std::string& s) {
    std::string q = "'";
    for (char ch : s) q += ch == '\'' ? std::string("''") : std::string(1, ch);
    return q + "'";
  };
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0) {
    if (error) *error = "gnuplot is not installed (apt-get install gnuplot-nox)";
    return false;
  }
  const std::string data = png_path + ".dat", script = png_path + ".gp";
  {
    std::ofstream d(data);
    d << "# step reward_mean heldout_acc\n";
    if (sft_heldout_acc) d << "0 NaN " << *sft_heldout_acc << "\n";   // where GRPO starts
    for (auto& r : read_metrics(metrics_path))
      d << r.step << " " << r.reward_mean << " " << (r.heldout_acc ? std::to_string(*r.heldout_acc) : "NaN") << "\n";
    std::ofstream s(script);
    s << "set terminal pngcairo size 900,500 font 'sans,10'\n"
      << "set output " << quoted(png_path) << "\n"
      << "set title " << quoted(title) << "\nset xlabel 'step'\nset ylabel 'fraction'\n"
      << "set yrange [0:1]\nset key top left\nset grid\nset datafile missing 'NaN'\n";
    if (sft_heldout_acc) s << "set arrow from graph 0, first " << *sft_heldout_acc << " to graph 1, first "
                           << *sft_heldout_acc << " nohead dashtype 2 lc rgb 'gray'\n"
                           << "set label 'held-out accuracy after SFT' at graph 0.75, first " << *sft_heldout_acc - 0.03
                           << " tc rgb 'gray'\n";
    s << "plot " << quoted(data) << " using 1:2 with lines lw 1.5 title 'train reward (mean)', \\\n"
      << "     " << quoted(data) << " using 1:3 with linespoints pt 7 ps 0.6 lw 2 title 'held-out accuracy (greedy)'\n";
  }
  char* argv[] = {const_cast<char*>("gnuplot"), const_cast<char*>(script.c_str()), nullptr};
  pid_t pid = -1;
  int status = -1;
  const bool ran = ::posix_spawnp(&pid, "gnuplot", nullptr, nullptr, argv, environ) == 0 && ::waitpid(pid, &status, 0) == pid &&
                   WIFEXITED(status) && WEXITSTATUS(status) == 0;
  if (!ran || !std::filesystem::exists(png_path)) {
    if (error) *error = "gnuplot failed on " + script;
    return false;
  }
  return true;
}

}  // namespace troupe::rl
