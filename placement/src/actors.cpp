// Actor placement and release, and the Scheduler's snapshots.
#include <algorithm>

#include "scheduler_impl.hpp"

namespace troupe::placement {

using detail::ActorRec;
using detail::BundleRec;
using detail::Demand;
using detail::GroupRec;
using detail::kNoSlot;

namespace {

std::string actor_name(ActorId id) { return "actor " + std::to_string(id); }

void detach(std::vector<ActorId>& list, std::size_t pos, std::unordered_map<ActorId, ActorRec>& actors) {
  const ActorId moved = list.back();
  list[pos] = moved;
  list.pop_back();
  if (pos < list.size()) actors.at(moved).pos = pos;
}

// Chooses the bundle of `g` for `req`: the named one, or the first with room.
Result<int> choose_bundle(const Scheduler::Impl& m, const GroupRec& g, const ActorRequest& req) {
  const BundleRef& ref = *req.bundle;
  const int n = static_cast<int>(g.bundles.size());
  if (ref.index >= n || ref.index < -1)
    return Error{PlacementCode::InvalidArgument, "group " + std::to_string(g.id) + " has " + std::to_string(n) +
                                                   " bundles; bundle " + std::to_string(ref.index) + " asked"};
  const Quantity gpu = req.resources.get(kGpu);
  bool any_reserved = false, any_total_fits = false;
  for (int i = ref.index < 0 ? 0 : ref.index; i < (ref.index < 0 ? n : ref.index + 1); ++i) {
    const BundleRec& b = g.bundles[i];
    if (b.slot == kNoSlot || (req.node && m.nodes[b.slot].id != *req.node)) continue;
    any_reserved = true;
    if (!req.selector.matches(m.nodes[b.slot].labels) || !req.resources.fits_in(b.total)) continue;
    any_total_fits = true;
    if (req.resources.fits_in(b.available) && b.gpus.can_take(gpu)) return i;
  }
  const std::string where = "group " + std::to_string(g.id) + (ref.index < 0 ? "" : " bundle " + std::to_string(ref.index));
  if (!any_reserved)
    return Error{PlacementCode::FailedPrecondition,
                 where + " is not reserved" + (req.node ? " on node " + std::to_string(*req.node) : std::string()) +
                     " (group " + std::string(to_string(g.state)) + ")"};
  if (!any_total_fits)
    return Error{PlacementCode::Infeasible, actor_name(req.actor) + " asks " + req.resources.to_string() +
                                              (req.selector.empty() ? "" : " on " + req.selector.to_string()) +
                                              ", more than " + where + " holds"};
  return Error{PlacementCode::Unavailable, actor_name(req.actor) + " asks " + req.resources.to_string() + " but " + where +
                                             " has no room left for it"};
}

}  // namespace

Result<Placement> Scheduler::Impl::place_in_bundle(const ActorRequest& req, ActorRec& rec) {
  auto git = groups.find(req.bundle->group);
  if (git == groups.end()) return Error{PlacementCode::NotFound, "no placement group " + std::to_string(req.bundle->group)};
  GroupRec& g = git->second;
  auto index = choose_bundle(*this, g, req);
  if (!index.ok()) return index.error();
  BundleRec& b = g.bundles[*index];
  b.available -= req.resources;
  Placement& p = rec.placement;
  p.gpus = b.gpus.take(req.resources.get(kGpu));
  rec.slot = b.slot;
  rec.pos = b.actors.size();
  b.actors.push_back(req.actor);
  p.bundle = BundleRef{g.id, *index};
  p.worker = {nodes[b.slot].id, req.colocate ? b.worker : next_worker++};
  return p;
}

Result<Placement> Scheduler::Impl::place_on_node(const ActorRequest& req, ActorRec& rec) {
  Demand d{req.resources, {req.resources.get(kGpu)}, req.selector.empty() ? nullptr : &req.selector, nullptr};
  if (req.node) {   // hard affinity: that node, alive and with room, or an error saying which
    auto it = slot_of.find(*req.node);
    if (it == slot_of.end() || nodes[it->second].state != NodeState::kAlive)
      return Error{PlacementCode::NotFound, actor_name(req.actor) + " is pinned to node " + std::to_string(*req.node) +
                                              ", which is not alive"};
    if (!fits(it->second, d))
      return Error{PlacementCode::Unavailable, actor_name(req.actor) + " asks " + req.resources.to_string() +
                                                 " on node " + std::to_string(*req.node) + ", which has not that free now"};
  }
  const std::uint32_t slot = req.node ? slot_of.at(*req.node) : pick_node(d);
  if (slot == kNoSlot) {
    const bool ever = fits_some_total(d);
    return Error{ever ? PlacementCode::Unavailable : PlacementCode::Infeasible,
                 actor_name(req.actor) + " asks " + req.resources.to_string() +
                     (req.selector.empty() ? "" : " on " + req.selector.to_string()) +
                     (ever ? ": no alive node has that free now" : ": no alive node could ever hold it")};
  }
  take_from_node(slot, req.resources);
  Placement& p = rec.placement;
  p.gpus = nodes[slot].gpus.take(req.resources.get(kGpu));
  rec.slot = slot;
  rec.pos = nodes[slot].actors.size();
  nodes[slot].actors.push_back(req.actor);
  p.worker = {nodes[slot].id, next_worker++};
  return p;
}

Result<Placement> Scheduler::place_actor(const ActorRequest& req) {
  Impl& m = *impl_;
  if (m.actors.contains(req.actor)) return Error{PlacementCode::AlreadyExists, actor_name(req.actor) + " is already placed"};
  TROUPE_RETURN_IF_ERROR(detail::check_amounts(req.resources, actor_name(req.actor)));
  if (req.colocate && (!req.bundle || req.bundle->index < 0))
    return Error{PlacementCode::InvalidArgument, actor_name(req.actor) + ": colocate needs a bundle index"};
  ActorRec rec;
  rec.resources = req.resources;
  rec.placement.actor = req.actor;
  auto placed = req.bundle ? m.place_in_bundle(req, rec) : m.place_on_node(req, rec);
  if (!placed.ok()) return placed;
  placed->node = m.nodes[rec.slot].id;
  rec.placement.node = placed->node;
  m.actors.emplace(req.actor, std::move(rec));
  return placed;
}

void Scheduler::Impl::erase_actor(ActorId id, bool return_resources) {
  auto it = actors.find(id);
  const ActorRec rec = std::move(it->second);
  if (rec.placement.bundle) {
    BundleRec& b = groups.at(rec.placement.bundle->group).bundles[rec.placement.bundle->index];
    detach(b.actors, rec.pos, actors);
    if (return_resources) {
      b.available += rec.resources;
      b.gpus.give(rec.placement.gpus);
    }
  } else {
    detach(nodes[rec.slot].actors, rec.pos, actors);
    if (return_resources) {
      give_to_node(rec.slot, rec.resources);
      nodes[rec.slot].gpus.give(rec.placement.gpus);
    }
  }
  actors.erase(id);
}

Status Scheduler::release_actor(ActorId id) {
  Impl& m = *impl_;
  auto it = m.actors.find(id);
  if (it == m.actors.end()) return Error{PlacementCode::NotFound, "no placed " + actor_name(id)};
  const bool frees_node = !it->second.placement.bundle;
  m.erase_actor(id, true);
  if (frees_node) m.retry_waiting();
  return Status{};
}

// ---------------------------------------------------------------- snapshots

std::optional<NodeView> Scheduler::node(NodeId id) const {
  auto it = impl_->slot_of.find(id);
  if (it == impl_->slot_of.end()) return std::nullopt;
  const detail::NodeRec& n = impl_->nodes[it->second];
  return NodeView{n.id, n.state, n.total, n.available, n.labels, n.gpus.free_per_device()};
}

std::optional<GroupView> Scheduler::group(PlacementGroupId id) const {
  auto it = impl_->groups.find(id);
  if (it == impl_->groups.end()) return std::nullopt;
  const GroupRec& g = it->second;
  GroupView v{g.id, g.name, g.strategy, g.state, {}, {}, {}, {}};
  for (const BundleRec& b : g.bundles) {
    v.bundles.push_back(b.total);
    v.bundle_nodes.push_back(b.slot == kNoSlot ? std::nullopt : std::optional(impl_->nodes[b.slot].id));
    v.bundle_available.push_back(b.available);
    v.actors.insert(v.actors.end(), b.actors.begin(), b.actors.end());
  }
  return v;
}

std::optional<Placement> Scheduler::actor(ActorId id) const {
  auto it = impl_->actors.find(id);
  if (it == impl_->actors.end()) return std::nullopt;
  return it->second.placement;
}

std::vector<NodeId> Scheduler::node_ids(bool alive_only) const {
  std::vector<NodeId> out;
  for (const auto& n : impl_->nodes)
    if (!alive_only || n.state == NodeState::kAlive) out.push_back(n.id);
  return out;
}

std::vector<PlacementGroupId> Scheduler::group_ids() const {
  std::vector<PlacementGroupId> out;
  for (const auto& [id, g] : impl_->groups) out.push_back(id);
  std::sort(out.begin(), out.end());
  return out;
}

std::size_t Scheduler::actor_count() const { return impl_->actors.size(); }

}  // namespace troupe::placement
