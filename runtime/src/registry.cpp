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
  ActorTypeInfo& info = types_.slot(name);
  if (info.name.empty()) info.name = name;
  return info;
}

}  // namespace troupe::detail
