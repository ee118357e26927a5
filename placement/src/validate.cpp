// Scheduler::validate: recompute the books from scratch and compare (PG-1, PG-2).
#include <algorithm>
#include <map>

#include "scheduler_impl.hpp"

namespace troupe::placement {

using detail::kNoSlot;

namespace {

Status broken(const std::string& what) { return {PlacementCode::FailedPrecondition, "invariant broken: " + what}; }

std::string node_name(const detail::NodeRec& n) { return "node " + std::to_string(n.id); }

// What every node should have handed out, rebuilt from the groups and actors.
struct Books {
  std::vector<Resources> used;
  std::vector<std::map<int, std::int64_t>> gpu_used;
  void charge(std::uint32_t slot, const Resources& r, const std::vector<GpuShare>& shares) {
    used[slot] += r;
    for (const GpuShare& s : shares) gpu_used[slot][s.index] += s.amount.units();
  }
};

Status check_groups(const Scheduler::Impl& m, Books& books) {
  for (const auto& [id, g] : m.groups) {
    const std::string gname = "group " + std::to_string(id);
    std::vector<std::uint32_t> slots;
    std::size_t placed = 0;
    for (std::size_t i = 0; i < g.bundles.size(); ++i) {
      const detail::BundleRec& b = g.bundles[i];
      Resources in_actors;
      for (ActorId a : b.actors) in_actors += m.actors.at(a).resources;
      if (b.slot == kNoSlot) {
        if (!b.actors.empty()) return broken(gname + " has actors in an unreserved bundle");
        continue;
      }
      ++placed;
      if (m.nodes[b.slot].state == NodeState::kDead) return broken(gname + " holds a bundle on a dead node");
      if (b.available != b.total - in_actors || b.available.any_negative())
        return broken(gname + " bundle " + std::to_string(i) + " books " + b.available.to_string() + " free");
      books.charge(b.slot, b.total, b.node_gpus);
      if (std::find(slots.begin(), slots.end(), b.slot) == slots.end()) slots.push_back(b.slot);
    }
    // PG-1: whole or nothing; only a group that lost bundles to a dead node is partial.
    if (g.state == GroupState::kCreated && placed != g.bundles.size()) return broken(gname + " is CREATED but partial");
    if (g.state == GroupState::kPending && placed != 0) return broken(gname + " is PENDING but holds bundles");
    if (g.strategy == Strategy::kStrictPack && slots.size() > 1) return broken(gname + " STRICT_PACK spans nodes");
    if (g.strategy == Strategy::kStrictSpread && slots.size() != placed) return broken(gname + " STRICT_SPREAD shares a node");
  }
  return Status{};
}

Status check_nodes(const Scheduler::Impl& m, Books& books) {
  for (const auto& [id, a] : m.actors)
    if (!a.placement.bundle) books.charge(a.slot, a.resources, a.placement.gpus);
  const auto& used = books.used;
  auto& gpu_used = books.gpu_used;
  Resources free_total;
  for (std::uint32_t s = 0; s < m.nodes.size(); ++s) {
    const detail::NodeRec& n = m.nodes[s];
    if (n.state == NodeState::kDead) continue;
    // PG-2: reservations never exceed totals, in aggregate and per GPU device.
    if (!used[s].fits_in(n.total)) return broken(node_name(n) + " holds " + used[s].to_string() + " > " + n.total.to_string());
    if (n.available != n.total - used[s]) return broken(node_name(n) + " books " + n.available.to_string() + " free");
    const auto free = n.gpus.free_per_device();
    for (std::size_t d = 0; d < free.size(); ++d) {
      const std::int64_t cap = std::min<std::int64_t>(Quantity::kScale, n.total.get(kGpu).units() - Quantity::kScale * d);
      if (free[d].units() < 0 || free[d].units() + gpu_used[s][static_cast<int>(d)] != cap)
        return broken(node_name(n) + " GPU " + std::to_string(d) + " device books disagree");
    }
    if (n.state == NodeState::kAlive) free_total += n.available;
    const bool indexed = n.bucket >= 0;
    if (indexed != (n.state == NodeState::kAlive)) return broken(node_name(n) + " index membership wrong");
    if (indexed && m.shapes[n.shape].buckets[n.bucket][n.pos] != s) return broken(node_name(n) + " index position wrong");
  }
  if (free_total != m.free_total) return broken("cluster free total " + m.free_total.to_string() + " != " + free_total.to_string());
  return Status{};
}

}  // namespace

Status Scheduler::validate() const {
  Books books{std::vector<Resources>(impl_->nodes.size()), std::vector<std::map<int, std::int64_t>>(impl_->nodes.size())};
  TROUPE_RETURN_IF_ERROR(check_groups(*impl_, books));
  return check_nodes(*impl_, books);
}

}  // namespace troupe::placement
