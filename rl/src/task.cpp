#include "troupe/rl/task.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

namespace troupe::rl {

AdditionTask::AdditionTask(int min_digits, int max_digits) : min_digits_(min_digits), max_digits_(max_digits) {
  if (min_digits < 1 || max_digits < min_digits || max_digits > 9)
    throw std::invalid_argument("AdditionTask: digits must satisfy 1 <= min <= max <= 9");
}

Problem AdditionTask::sample(std::mt19937_64& rng) const {
  auto operand = [&] {
    const int digits = std::uniform_int_distribution<int>(min_digits_, max_digits_)(rng);
    std::int64_t lo = 1;
    for (int i = 1; i < digits; ++i) lo *= 10;
    const std::int64_t hi = lo * 10 - 1;
    return std::uniform_int_distribution<std::int64_t>(digits == 1 ? 0 : lo, hi)(rng);
  };
  const std::int64_t a = operand(), b = operand();
  return Problem{std::to_string(a) + "+" + std::to_string(b) + "=", std::to_string(a + b)};
}

std::string AdditionTask::kind(const Problem& p) const {
  const auto plus = p.prompt.find('+'), eq = p.prompt.find('=');
  if (plus == std::string::npos || eq == std::string::npos || eq < plus) return {};
  return std::to_string(plus) + "+" + std::to_string(eq - plus - 1);
}

double AdditionTask::kind_size(const std::string& kind) const {
  auto numbers = [](int digits) { return digits == 1 ? 10.0 : 9.0 * std::pow(10.0, digits - 1); };   // 0-9, then 10^(d-1)..
  const auto plus = kind.find('+');
  if (plus == std::string::npos) return 0;
  const int a = std::atoi(kind.substr(0, plus).c_str()), b = std::atoi(kind.substr(plus + 1).c_str());
  if (a < 1 || b < 1) return 0;
  return numbers(a) * numbers(b);
}

std::unique_ptr<Task> make_task(const std::string& spec) {
  const std::string prefix = "addition:";
  if (spec.rfind(prefix, 0) == 0) {   // addition:MIN-MAX, each all digits (1-3x, 1- and 1-99999999999 are refused)
    const std::string range = spec.substr(prefix.size());
    const auto dash = range.find('-');
    auto whole = [](std::string_view s, int& v) {
      const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
      return !s.empty() && ec == std::errc{} && end == s.data() + s.size();
    };
    int lo = 0, hi = 0;
    if (dash != std::string::npos && whole(std::string_view(range).substr(0, dash), lo) &&
        whole(std::string_view(range).substr(dash + 1), hi))
      return std::make_unique<AdditionTask>(lo, hi);
  }
  throw std::invalid_argument("unknown task '" + spec + "' (expected addition:<min>-<max>)");
}

Dataset Dataset::make(const Task& task, std::size_t train_size, std::size_t heldout_size, std::uint64_t seed,
                      double max_kind_share) {
  if (!(max_kind_share > 0)) throw std::invalid_argument("Dataset: max_kind_share must be > 0");
  std::mt19937_64 rng(seed);
  Dataset d;
  std::unordered_set<std::string> seen;
  std::unordered_map<std::string, std::size_t> taken;   // held-out problems of each kind
  // Draw held-out first; a bounded number of attempts keeps a tiny task space from looping forever.
  for (std::size_t tries = 0; d.heldout.size() < heldout_size && tries < 100 * heldout_size; ++tries) {
    Problem p = task.sample(rng);
    if (seen.count(p.prompt)) continue;
    if (max_kind_share < 1) {
      const auto k = task.kind(p);
      const double size = task.kind_size(k);
      if (size > 0 && double(taken[k] + 1) > max_kind_share * size) continue;   // the kind has given its share
      ++taken[k];
    }
    seen.insert(p.prompt);
    d.heldout.push_back(std::move(p));
  }
  for (std::size_t tries = 0; d.train.size() < train_size && tries < 100 * train_size; ++tries) {
    Problem p = task.sample(rng);
    if (!seen.count(p.prompt)) d.train.push_back(std::move(p));
  }
  if (d.train.empty()) throw std::invalid_argument("Dataset: the task has no problem left for training");
  return d;
}

std::vector<Problem> DataCursor::next(const std::vector<Problem>& set, std::size_t n) {
  if (n == 0) return {};
  if (index < 0 || index >= std::int64_t(set.size()))   // a cursor restored over other data
    throw std::invalid_argument("DataCursor::next: index " + std::to_string(index) + " is outside a set of " + std::to_string(set.size()));
  std::vector<Problem> out;
  out.reserve(n);
  std::vector<std::size_t> order;
  std::int64_t order_epoch = -1;
  while (out.size() < n) {
    if (order_epoch != epoch) {
      order.resize(set.size());
      std::iota(order.begin(), order.end(), std::size_t(0));
      std::mt19937_64 rng(seed ^ (0x9e3779b97f4a7c15ull * std::uint64_t(epoch + 1)));
      std::shuffle(order.begin(), order.end(), rng);
      order_epoch = epoch;
    }
    out.push_back(set[order[std::size_t(index)]]);
    if (++index == std::int64_t(set.size())) { ++epoch; index = 0; }
  }
  return out;
}

}  // namespace troupe::rl
