// The free functions behind troupe/elastic.hpp's templates: they reach the cluster client.
#include "troupe/elastic.hpp"

#include <spdlog/spdlog.h>

#include "cluster/client.hpp"
#include "runtime_impl.hpp"

namespace troupe::detail {

std::uint64_t elastic_create(RuntimeImpl& rt, const ActorTypeInfo& type, const std::string& signature, Payload ctor_args,
                             const Options& opts, const Elastic& e) {
  const std::string name = e.name().empty() ? type.name : e.name();
  return rt.cluster().create_elastic(type, signature, ctor_args, opts, name, e.min(), e.max());
}

std::vector<std::shared_ptr<ActorCell>> elastic_members(RuntimeImpl& rt, std::uint64_t group, const std::string& type,
                                                        const Options& opts) {
  return rt.cluster().elastic_members(group, type, opts);
}

Status elastic_wait(RuntimeImpl& rt, std::uint64_t group, std::size_t min, std::chrono::milliseconds timeout) {
  std::string why;
  if (rt.cluster().wait_elastic(group, min, std::chrono::steady_clock::now() + timeout, &why)) return {};
  return Error{ErrorCode::Unavailable, "elastic group " + std::to_string(group) + " has fewer than " + std::to_string(min) +
                                           " members after " + std::to_string(timeout.count()) + " ms: " + why};
}

Status elastic_scale(RuntimeImpl& rt, std::uint64_t group, int target) {
  try {
    rt.cluster().request("POST", "/api/v1/elastic_groups/" + std::to_string(group) + "/scale",
                         nlohmann::json{{"replicas", target}});
  } catch (const CallError& e) {
    return e.error();
  }
  return {};
}

Status elastic_remove(RuntimeImpl& rt, std::uint64_t group) {
  try {
    rt.cluster().request("DELETE", "/api/v1/elastic_groups/" + std::to_string(group), nullptr);
  } catch (const CallError& e) {
    return e.error();
  }
  return {};
}

void elastic_log(const std::string& what) { spdlog::warn("{}", what); }

}  // namespace troupe::detail
