#include "troupe/placement/labels.hpp"

#include <algorithm>

namespace troupe::placement {

LabelSelector& LabelSelector::in(std::string key, std::vector<std::string> values) {
  terms_.push_back({std::move(key), LabelTerm::Op::kIn, std::move(values)});
  return *this;
}

LabelSelector& LabelSelector::not_in(std::string key, std::vector<std::string> values) {
  terms_.push_back({std::move(key), LabelTerm::Op::kNotIn, std::move(values)});
  return *this;
}

LabelSelector& LabelSelector::exists(std::string key) {
  terms_.push_back({std::move(key), LabelTerm::Op::kExists, {}});
  return *this;
}

LabelSelector& LabelSelector::does_not_exist(std::string key) {
  terms_.push_back({std::move(key), LabelTerm::Op::kDoesNotExist, {}});
  return *this;
}

bool LabelSelector::matches(const Labels& labels) const {
  for (const LabelTerm& t : terms_) {
    auto it = labels.find(t.key);
    const bool has = it != labels.end();
    const bool listed = has && std::find(t.values.begin(), t.values.end(), it->second) != t.values.end();
    switch (t.op) {
      case LabelTerm::Op::kIn: if (!listed) return false; break;
      case LabelTerm::Op::kNotIn: if (listed) return false; break;
      case LabelTerm::Op::kExists: if (!has) return false; break;
      case LabelTerm::Op::kDoesNotExist: if (has) return false; break;
    }
  }
  return true;
}

const LabelTerm* LabelSelector::first_in_term() const {
  for (const LabelTerm& t : terms_)
    if (t.op == LabelTerm::Op::kIn) return &t;
  return nullptr;
}

std::string LabelSelector::to_string() const {
  std::string out;
  for (const LabelTerm& t : terms_) {
    if (!out.empty()) out += ", ";
    std::string list;
    for (const auto& v : t.values) list += (list.empty() ? "" : ",") + v;
    switch (t.op) {
      case LabelTerm::Op::kIn: out += t.key + " in (" + list + ")"; break;
      case LabelTerm::Op::kNotIn: out += t.key + " not in (" + list + ")"; break;
      case LabelTerm::Op::kExists: out += t.key; break;
      case LabelTerm::Op::kDoesNotExist: out += "!" + t.key; break;
    }
  }
  return out.empty() ? "(any)" : out;
}

}  // namespace troupe::placement
