#include "troupe/registry.hpp"

namespace troupe::detail {

const MethodInfo* ActorTypeInfo::find_method(std::string_view method) const {
  for (const auto& m : methods) if (m.name == method) return &m;
  return nullptr;
}

Factory ActorTypeInfo::find_factory(const std::string& signature) const {
  auto it = factories.find(signature);
  return it == factories.end() ? nullptr : it->second;
}

Registry& Registry::instance() {
  static Registry r;   // function-local: safe to use from other static initialisers
  return r;
}

ActorTypeInfo& Registry::type(const std::string& name) {
  auto it = types_.find(name);
  if (it == types_.end()) {
    it = types_.emplace(name, ActorTypeInfo{}).first;
    it->second.name = name;
  }
  return it->second;
}

const ActorTypeInfo* Registry::find(std::string_view name) const {
  auto it = types_.find(name);
  return it == types_.end() ? nullptr : &it->second;
}

std::vector<std::string> Registry::type_names() const {
  std::vector<std::string> out;
  for (const auto& [name, _] : types_) out.push_back(name);
  return out;
}

}  // namespace troupe::detail
