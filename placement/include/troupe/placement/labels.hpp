// Node labels and the selectors that constrain placement to labelled nodes.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

namespace troupe::placement {

// Free-form key/value pairs a node carries, e.g. {"zone": "us-east-1a", "accel": "H200"}.
using Labels = std::map<std::string, std::string, std::less<>>;

// One condition on one label key.
struct LabelTerm {
  enum class Op { kIn, kNotIn, kExists, kDoesNotExist };
  std::string key;
  Op op = Op::kIn;
  std::vector<std::string> values;  // used by kIn / kNotIn only
};

// A conjunction of terms; the empty selector matches every node. Selectors with a kIn term
// are resolved through a label index (fast even at 10k nodes); others filter while scanning.
class LabelSelector {
 public:
  LabelSelector() = default;
  // Convenience builders; each returns *this so terms chain: sel.in("zone", {"a"}).exists("gpu").
  LabelSelector& in(std::string key, std::vector<std::string> values);
  LabelSelector& not_in(std::string key, std::vector<std::string> values);
  LabelSelector& exists(std::string key);
  LabelSelector& does_not_exist(std::string key);
  static LabelSelector equals(std::string key, std::string value) {
    return LabelSelector().in(std::move(key), {std::move(value)});
  }

  bool empty() const { return terms_.empty(); }
  bool matches(const Labels& labels) const;
  const std::vector<LabelTerm>& terms() const { return terms_; }
  // The first kIn term, or nullptr; the scheduler uses it to look candidates up by label.
  const LabelTerm* first_in_term() const;
  // "zone in (a,b), !gpu" for error messages.
  std::string to_string() const;

 private:
  std::vector<LabelTerm> terms_;
};

}  // namespace troupe::placement
