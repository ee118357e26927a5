// Per-step metrics: one JSON object per line (JSONL), a live progress line on the terminal, and a
// PNG plot at the end (gnuplot).
#pragma once

#include <cstdint>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace troupe::rl {

// Wall-clock seconds of each phase of one step.
struct StepTimes {
  double rollout = 0, reward = 0, reference = 0, train = 0, sync = 0, eval = 0, total = 0;
};

// Seconds inside the actors' own methods, as they measured them: the rollout engines' generates
// (the slowest engine's of each, RolloutBatch::seconds) and the trainer's train steps (TrainMetrics::
// seconds), summed over the step. Against the same phases in StepTimes, the rest is the calls'
// cost: encoding, the way there and back, the waits.
struct ActorTimes {
  double rollout = 0, train = 0;
};

struct StepRecord {
  std::int64_t step = 0;
  std::int64_t policy_version = 0;      // after the update
  std::int64_t sample_version = 0;      // the version that generated this step's samples (RL-1)
  double reward_mean = 0, reward_std = 0;
  double format_ok = 0;                 // share of samples whose format was valid
  double response_tokens = 0;           // mean generated tokens per sample
  double loss = 0, pg_loss = 0, kl = 0, entropy = 0, clip_fraction = 0, grad_norm = 0, lr = 0;
  std::optional<double> heldout_acc, heldout_format;   // on evaluation steps only
  std::map<std::string, double> heldout_acc_by_kind;   // on evaluation steps, of a task with kinds
  double tokens_per_s = 0;              // generated tokens / step wall time
  std::int32_t rollout_engines = 1;     // the engines this step's samples were split across
  std::string samples_digest;           // of the step's tokens and masks (16 hex digits): equal digests, equal samples
  StepTimes seconds;
  ActorTimes actor_seconds;
  std::map<std::string, double> values;  // every metric the objective reported, by name ("values" in the JSON line)
};

std::string to_json_line(const StepRecord& r);
StepRecord record_from_json_line(const std::string& line);   // throws on a malformed line

class MetricsLog {
 public:
  // Opens `path` for appending. When keep_up_to >= 0, first drops records of later steps (a resumed
  // run rewrites the steps after its checkpoint) and a torn last line (std::runtime_error naming
  // the line for a bad one before it); otherwise starts the file afresh. The kept lines replace
  // the file by a rename.
  MetricsLog(std::string path, std::int64_t keep_up_to = -1);
  void write(const StepRecord& r);   // flushed at once; std::runtime_error when the write fails (a full disk)
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::ofstream out_;
};

std::vector<StepRecord> read_metrics(const std::string& path);

// One status line, redrawn in place when stderr is a terminal, else printed every `every` steps.
class ProgressLine {
 public:
  // quiet (enabled false) prints nothing.
  ProgressLine(std::int64_t total_steps, std::int64_t every = 10, bool enabled = true);
  void update(const StepRecord& r, double elapsed_s);
  void message(const std::string& text);   // a full line above the progress line
  void finish();

 private:
  std::int64_t total_, every_;
  bool enabled_;
  bool tty_;
  bool drawn_ = false;
};

// Plots reward mean and held-out accuracy against the step. Returns false (and writes nothing)
// when gnuplot is not installed or fails; `error` then says why.
bool plot_metrics(const std::string& metrics_path, const std::string& png_path, const std::string& title,
                  std::optional<double> sft_heldout_acc, std::string* error);

}  // namespace troupe::rl
