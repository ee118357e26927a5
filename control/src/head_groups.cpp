// Placement groups on the head: bundles reserved atomically by the scheduler (PG-1, PG-2);
// removing a group kills its actors.
#include <spdlog/spdlog.h>

#include "troupe/control/head.hpp"

namespace troupe::control {

using json = nlohmann::json;

net::HttpResponse Head::create_group(const json& body) {
  placement::PlacementGroupSpec spec;
  for (const auto& b : body.at("bundles")) {
    auto r = placement::Resources::parse(b.get<std::string>());
    if (!r.ok()) return error_reply(400, "bad bundle '" + b.get<std::string>() + "': " + r.error().message);
    spec.bundles.push_back(*r);
  }
  auto strategy = placement::parse_strategy(body.value("strategy", "PACK"));
  if (!strategy.ok()) return error_reply(400, strategy.error().message);
  spec.strategy = *strategy;
  spec.name = body.value("name", "");
  spec.wait_if_unplaced = body.value("wait", true);
  std::lock_guard lk(mu_);
  auto created = scheduler_.create_placement_group(spec);
  if (!created.ok()) return error_reply(created.error().code == PlacementCode::InvalidArgument ? 400 : 409,
                                           created.error().to_string());
  spdlog::info("head: placement group {} ({}, {} bundles): {}", created->id, placement::to_string(spec.strategy),
               spec.bundles.size(), placement::to_string(created->state));
  changed();
  return reply(200, json{{"id", created->id}, {"state", std::string(placement::to_string(created->state))},
                         {"reason", created->reason.ok() ? "" : created->reason.error().to_string()}});
}

net::HttpResponse Head::get_group(std::uint64_t id, std::chrono::milliseconds wait) {
  std::unique_lock lk(mu_);
  auto g = scheduler_.group(id);
  if (!g) return error_reply(404, "unknown placement group " + std::to_string(id));
  // ?wait_ms=N: a group still waiting for room is answered when its state changes (or at N).
  const auto state = g->state;
  if (state == placement::GroupState::kPending || state == placement::GroupState::kRescheduling) {
    cv_.wait_for(lk, wait, [&] {
      auto now = scheduler_.group(id);
      return stopping_ || !now || now->state != state;
    });
    g = scheduler_.group(id);
    if (!g) return error_reply(404, "placement group " + std::to_string(id) + " was removed");
  }
  return reply(200, group_json(*g));
}

net::HttpResponse Head::remove_group(std::uint64_t id) {
  std::lock_guard lk(mu_);
  auto removed = scheduler_.remove_placement_group(id);
  if (!removed.ok()) return error_reply(404, removed.error().to_string());
  for (auto aid : *removed) {
    auto it = actors_.find(aid);
    if (it != actors_.end() && it->second.state != "dead") bury(it->second, "its placement group was removed");
  }
  after_release();
  changed();
  return reply(200, json{{"removed", id}, {"killed_actors", *removed}});
}

json Head::group_json(const placement::GroupView& g) const {
  json bundles = json::array();
  for (std::size_t i = 0; i < g.bundles.size(); ++i) {
    bundles.push_back(json{{"resources", g.bundles[i].to_string()},
                           {"node", g.bundle_nodes[i] ? json(*g.bundle_nodes[i]) : json(nullptr)},
                           {"available", g.bundle_available[i].to_string()}});
  }
  return json{{"id", g.id}, {"name", g.name}, {"strategy", std::string(placement::to_string(g.strategy))},
              {"state", std::string(placement::to_string(g.state))}, {"bundles", bundles}, {"actors", g.actors}};
}

}  // namespace troupe::control
