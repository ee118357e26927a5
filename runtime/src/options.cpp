#include "troupe/options.hpp"

#include "troupe/runtime.hpp"

#include <cstdio>

namespace troupe {
namespace {

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4f", v);   // resources are fixed point with 4 decimals
  std::string s(buf);
  while (!s.empty() && s.back() == '0') s.pop_back();
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

}  // namespace

Options& Options::bundle(const PlacementGroup& group, int index, bool colocate) {
  group_ = group.id();
  bundle_index_ = index;
  colocate_ = colocate;
  return *this;
}

std::string Options::resource_text() const {
  std::string out;
  auto add = [&](const std::string& item) { out += (out.empty() ? "" : ",") + item; };
  if (cpus_ > 0) add("CPU=" + number(cpus_));
  if (gpus_ > 0) add("GPU=" + number(gpus_));
  if (!resources_.empty()) add(resources_);
  return out;
}

}  // namespace troupe
