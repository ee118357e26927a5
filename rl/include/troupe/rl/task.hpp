// Verifiable tasks: problems with exact answers, fixed train and held-out sets, and a data cursor
// that walks the train set in a seeded order, epoch after epoch, so a resumed run continues where
// it stopped (RL-2: no problem lost or repeated within an epoch).
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "troupe/troupe.hpp"

namespace troupe::rl {

struct Problem {
  std::string prompt;   // what the policy sees, e.g. "47+385="
  std::string answer;   // the exact answer, e.g. "432"
};

class Task {
 public:
  virtual ~Task() = default;
  virtual std::string name() const = 0;
  virtual Problem sample(std::mt19937_64& rng) const = 0;
  virtual std::string alphabet() const = 0;     // every character of prompts and answers
  virtual std::string verifier() const = 0;     // the Reward actor's verifier for the answers
  virtual int max_answer_chars() const = 0;     // generation budget (the stop token comes on top)
  virtual int max_prompt_chars() const = 0;
  // Problems come in kinds (addition: the operands' digit counts, "1+2"), so that a held-out set
  // cannot take most of a small kind away from training (Dataset::make). kind_size: how many
  // distinct problems the kind has; 0: unknown (no bound). A task without kinds keeps these.
  virtual std::string kind(const Problem&) const { return {}; }
  virtual double kind_size(const std::string& /*kind*/) const { return 0; }
};

// "a+b=" -> "a+b" with each operand drawn uniformly among numbers of min_digits..max_digits digits
// (the digit count first, uniformly, then the number).
class AdditionTask final : public Task {
 public:
  AdditionTask(int min_digits, int max_digits);   // 1 <= min <= max <= 9
  std::string name() const override { return "addition"; }
  Problem sample(std::mt19937_64& rng) const override;
  std::string alphabet() const override { return "0123456789+="; }
  std::string verifier() const override { return "integer"; }
  int max_answer_chars() const override { return max_digits_ + 1; }
  int max_prompt_chars() const override { return 2 * max_digits_ + 2; }
  std::string kind(const Problem& p) const override;   // "<digits of a>+<digits of b>"
  double kind_size(const std::string& kind) const override;

 private:
  int min_digits_, max_digits_;
};

// Builds a task by name: "addition:<min>-<max>" (e.g. "addition:1-3"). Throws std::invalid_argument.
std::unique_ptr<Task> make_task(const std::string& spec);

// Disjoint train and held-out sets drawn from the task with `seed` (no prompt in both). The
// held-out problems are drawn first, distinct, and each one leaves the train set (whose
// train_size draws may repeat a problem); of a kind (Task::kind) the held-out set takes at most
// max_kind_share of its problems, so that every kind stays in training: with addition of 1-2
// digits an unbounded draw of 500 takes ~80 of the 100 one-digit sums, and a model then never
// learns the rest. max_kind_share >= 1: no bound (the draws of a set made before the bound).
inline constexpr double kHeldoutKindShare = 0.2;   // the default here and of TaskConfig::heldout_kind_share
struct Dataset {
  std::vector<Problem> train, heldout;
  static Dataset make(const Task& task, std::size_t train_size, std::size_t heldout_size, std::uint64_t seed,
                      double max_kind_share = kHeldoutKindShare);
};

// Position in the train set: epoch e visits a permutation drawn from (seed, e).
struct DataCursor {
  std::uint64_t seed = 0;
  std::int64_t epoch = 0;
  std::int64_t index = 0;   // next position in this epoch's permutation
  MSGPACK_DEFINE(seed, epoch, index);

  // The next n problems (wrapping into the next epoch when needed).
  std::vector<Problem> next(const std::vector<Problem>& set, std::size_t n);
};

}  // namespace troupe::rl
