// Placement groups: atomic reservation under the four strategies (PG-1), removal, the
// waiting queue, and re-reservation after a node dies.
#include <algorithm>
#include <functional>
#include <tuple>
#include <unordered_set>

#include "scheduler_impl.hpp"

namespace troupe::placement {

using detail::BundleRec;
using detail::Demand;
using detail::GroupRec;
using detail::kNoSlot;

namespace {

// Largest first (GPU, then CPU, then memory): big bundles are the hard ones to fit, and GPU
// slices must be taken in the order GpuPool::can_take_all checks them.
std::vector<int> largest_first(const GroupRec& g, std::vector<int> todo) {
  auto key = [&](int i) {
    const Resources& r = g.bundles[i].total;
    return std::tuple(r.get(kGpu), r.get(kCpu), r.get(kMemory));
  };
  std::stable_sort(todo.begin(), todo.end(), [&](int a, int b) { return key(a) > key(b); });
  return todo;
}

Demand bundle_demand(const GroupRec& g, int i) {
  const Resources& r = g.bundles[i].total;
  return Demand{r, {r.get(kGpu)}, g.selector.empty() ? nullptr : &g.selector, nullptr};
}

// Kuhn's augmenting paths over bundles (left) and node slots (right).
bool augment(int u, const std::vector<std::vector<std::uint32_t>>& edges,
             std::unordered_map<std::uint32_t, int>& owner, std::unordered_set<std::uint32_t>& visited) {
  for (std::uint32_t v : edges[u]) {
    if (!visited.insert(v).second) continue;
    auto it = owner.find(v);
    if (it == owner.end() || augment(it->second, edges, owner, visited)) {
      owner[v] = u;
      return true;
    }
  }
  return false;
}

// The size of a maximum matching; match[u] is bundle u's node slot (kNoSlot when unmatched).
std::size_t max_matching(const std::vector<std::vector<std::uint32_t>>& edges, std::vector<std::uint32_t>& match) {
  std::unordered_map<std::uint32_t, int> owner;
  std::unordered_set<std::uint32_t> visited;
  std::size_t size = 0;
  for (int u = 0; u < static_cast<int>(edges.size()); ++u) {
    visited.clear();
    if (augment(u, edges, owner, visited)) ++size;
  }
  match.assign(edges.size(), kNoSlot);
  for (auto [v, u] : owner) match[u] = v;
  return size;
}

}  // namespace

std::vector<std::uint32_t> Scheduler::Impl::group_slots(const GroupRec& g) const {
  std::vector<std::uint32_t> out;
  for (const BundleRec& b : g.bundles)
    if (b.slot != kNoSlot && std::find(out.begin(), out.end(), b.slot) == out.end()) out.push_back(b.slot);
  return out;
}

void Scheduler::Impl::reserve_bundle(GroupRec& g, int index, std::uint32_t slot) {
  BundleRec& b = g.bundles[index];
  b.slot = slot;
  b.available = b.total;
  take_from_node(slot, b.total);
  b.node_gpus = nodes[slot].gpus.take(b.total.get(kGpu));
  b.gpus = detail::GpuPool::from_shares(b.node_gpus);
  b.worker = next_worker++;
  nodes[slot].bundles.emplace_back(g.id, index);
}

void Scheduler::Impl::unreserve_bundle(GroupRec& g, int index) {
  BundleRec& b = g.bundles[index];
  detail::NodeRec& n = nodes[b.slot];
  if (n.state != NodeState::kDead) {
    give_to_node(b.slot, b.total);
    n.gpus.give(b.node_gpus);
  }
  std::erase(n.bundles, std::pair(g.id, index));
  b.slot = kNoSlot;
  b.available = b.total;
  b.node_gpus.clear();
  b.gpus = {};
}

bool Scheduler::Impl::place_on_one(GroupRec& g, const std::vector<int>& todo) {
  Demand d{{}, {}, g.selector.empty() ? nullptr : &g.selector, nullptr};
  for (int i : todo) {
    d.total += g.bundles[i].total;
    if (g.bundles[i].total.get(kGpu).units() > 0) d.gpu_parts.push_back(g.bundles[i].total.get(kGpu));
  }
  const std::vector<std::uint32_t> used = group_slots(g);
  std::uint32_t slot = kNoSlot;
  for (std::uint32_t s : used)
    if (fits(s, d)) slot = s;
  if (slot == kNoSlot && (used.empty() || g.strategy != Strategy::kStrictPack)) slot = pick_node(d);
  if (slot == kNoSlot) return false;
  for (int i : largest_first(g, todo)) reserve_bundle(g, i, slot);
  return true;
}

bool Scheduler::Impl::place_greedy(GroupRec& g, const std::vector<int>& todo) {
  std::vector<std::uint32_t> used = group_slots(g);
  std::vector<int> placed;
  for (int i : largest_first(g, todo)) {
    Demand d = bundle_demand(g, i);
    std::uint32_t slot = kNoSlot;
    if (g.strategy == Strategy::kPack) {
      for (std::uint32_t s : used)
        if (slot == kNoSlot && fits(s, d)) slot = s;
    } else if (g.strategy == Strategy::kSpread) {
      d.exclude = &used;
      slot = pick_node(d);
      d.exclude = nullptr;
    } else {  // kStrictSpread
      d.exclude = &used;
    }
    if (slot == kNoSlot) slot = pick_node(d);
    if (slot == kNoSlot) {
      for (int p : placed) unreserve_bundle(g, p);
      return false;
    }
    reserve_bundle(g, i, slot);
    placed.push_back(i);
    if (std::find(used.begin(), used.end(), slot) == used.end()) used.push_back(slot);
  }
  return true;
}

bool Scheduler::Impl::place_strict_spread(GroupRec& g, const std::vector<int>& todo) {
  if (place_greedy(g, todo)) return true;
  // Greedy can paint itself into a corner with unequal bundles; one bundle per node is a
  // bipartite matching, so solve it exactly over every alive node.
  const std::vector<std::uint32_t> used = group_slots(g);
  std::vector<std::vector<std::uint32_t>> edges(todo.size());
  for (std::size_t k = 0; k < todo.size(); ++k) {
    Demand d = bundle_demand(g, todo[k]);
    d.exclude = &used;
    for (std::uint32_t s = 0; s < nodes.size(); ++s)
      if (fits(s, d)) edges[k].push_back(s);
  }
  std::vector<std::uint32_t> match;
  if (max_matching(edges, match) < todo.size()) return false;
  for (std::size_t k = 0; k < todo.size(); ++k) reserve_bundle(g, todo[k], match[k]);
  return true;
}

bool Scheduler::Impl::place_bundles(GroupRec& g, std::vector<int> todo) {
  if (todo.empty()) return true;
  switch (g.strategy) {
    case Strategy::kStrictPack: return place_on_one(g, todo);
    case Strategy::kPack: return place_on_one(g, todo) || place_greedy(g, todo);
    case Strategy::kSpread: return place_greedy(g, todo);
    case Strategy::kStrictSpread: return place_strict_spread(g, todo);
  }
  return false;
}

Status Scheduler::Impl::explain_unplaced(const GroupRec& g, const std::vector<int>& todo) const {
  const std::string what = "group " + std::to_string(g.id) + (g.name.empty() ? "" : " '" + g.name + "'") + " (" +
                           std::string(to_string(g.strategy)) + ", " + std::to_string(todo.size()) + " bundles)";
  const LabelSelector* sel = g.selector.empty() ? nullptr : &g.selector;
  if (g.strategy == Strategy::kStrictPack) {
    Demand d{{}, {}, sel, nullptr};
    for (int i : todo) {
      d.total += g.bundles[i].total;
      d.gpu_parts.push_back(g.bundles[i].total.get(kGpu));
    }
    if (!fits_some_total(d))
      return {PlacementCode::Infeasible, what + ": no alive node could ever hold " + d.total.to_string() + " at once"};
  } else if (g.strategy == Strategy::kStrictSpread) {
    const std::vector<std::uint32_t> used = group_slots(g);
    std::vector<std::vector<std::uint32_t>> edges(todo.size());
    for (std::size_t k = 0; k < todo.size(); ++k)
      for (std::uint32_t s = 0; s < nodes.size(); ++s) {
        const auto& n = nodes[s];
        const Resources& r = g.bundles[todo[k]].total;
        if (n.state == NodeState::kAlive && std::find(used.begin(), used.end(), s) == used.end() &&
            r.fits_in(n.total) && (!sel || sel->matches(n.labels)) &&
            detail::GpuPool::for_node(n.total.get(kGpu)).can_take(r.get(kGpu)))
          edges[k].push_back(s);
      }
    std::vector<std::uint32_t> match;
    if (const std::size_t m = max_matching(edges, match); m < todo.size())
      return {PlacementCode::Infeasible, what + ": even on an empty cluster only " + std::to_string(m) +
                                           " of its bundles could sit on distinct alive nodes"};
  } else {
    for (int i : todo) {
      Demand d = bundle_demand(g, i);
      if (!fits_some_total(d))
        return {PlacementCode::Infeasible, what + ": bundle " + std::to_string(i) + " {" + d.total.to_string() + "}" +
                                             (sel ? " on " + sel->to_string() : "") + " fits no alive node"};
    }
  }
  return {PlacementCode::Unavailable, what + " fits the cluster's totals but not what is free now"};
}

void Scheduler::Impl::retry_waiting() {
  if (rescheduling.empty() && pending.empty()) return;
  // Groups that lost bundles to a dead node go first, then new groups in creation order.
  for (std::set<PlacementGroupId>* queue : {&rescheduling, &pending})
    for (PlacementGroupId id : std::vector<PlacementGroupId>(queue->begin(), queue->end())) {
      GroupRec& g = groups.at(id);
      std::vector<int> todo;
      Resources need;
      for (int i = 0; i < static_cast<int>(g.bundles.size()); ++i)
        if (g.bundles[i].slot == kNoSlot) todo.push_back(i), need += g.bundles[i].total;
      if (!need.fits_in(free_total) || !place_bundles(g, todo)) continue;  // cheap check first
      g.state = GroupState::kCreated;
      queue->erase(id);
      ready.push_back(id);
    }
}

// ---------------------------------------------------------------- public API

namespace {

// A group's record from its spec, bundles checked; nothing reserved.
Result<GroupRec> new_group(PlacementGroupId id, PlacementGroupSpec& spec) {
  if (spec.bundles.empty()) return Error{PlacementCode::InvalidArgument, "a placement group needs at least one bundle"};
  GroupRec g;
  for (std::size_t i = 0; i < spec.bundles.size(); ++i) {
    const std::string what = "bundle " + std::to_string(i);
    if (spec.bundles[i].empty()) return Error{PlacementCode::InvalidArgument, what + " asks for nothing"};
    TROUPE_RETURN_IF_ERROR(detail::check_amounts(spec.bundles[i], what));
    g.bundles.push_back(BundleRec{spec.bundles[i], spec.bundles[i], kNoSlot, {}, {}, 0, {}});
  }
  g.id = id;
  g.name = std::move(spec.name);
  g.strategy = spec.strategy;
  g.selector = std::move(spec.selector);
  return g;
}

}  // namespace

Result<CreateResult> Scheduler::create_placement_group(PlacementGroupSpec spec) {
  Impl& m = *impl_;
  auto made = new_group(m.next_group, spec);
  if (!made.ok()) return made.error();
  GroupRec& g = *made;
  ++m.next_group;
  std::vector<int> all(g.bundles.size());
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int>(i);
  CreateResult out{g.id, GroupState::kCreated, Status{}};
  if (!m.place_bundles(g, all)) {
    out.reason = m.explain_unplaced(g, all);
    if (!spec.wait_if_unplaced) return out.reason.error();
    out.state = g.state = GroupState::kPending;
    m.pending.insert(g.id);
  } else {
    g.state = GroupState::kCreated;
  }
  m.groups.emplace(g.id, std::move(g));
  return out;
}

Result<CreateResult> Scheduler::restore_placement_group(PlacementGroupId id, PlacementGroupSpec spec,
                                                        const std::vector<std::optional<NodeId>>& bundle_nodes) {
  Impl& m = *impl_;
  if (id == 0 || m.groups.contains(id))
    return Error{PlacementCode::AlreadyExists, "placement group id " + std::to_string(id) + " is taken"};
  if (bundle_nodes.size() != spec.bundles.size())
    return Error{PlacementCode::InvalidArgument, "group " + std::to_string(id) + ": " + std::to_string(bundle_nodes.size()) +
                                                  " bundle nodes for " + std::to_string(spec.bundles.size()) + " bundles"};
  auto made = new_group(id, spec);
  if (!made.ok()) return made.error();
  GroupRec& g = *made;
  m.next_group = std::max(m.next_group, id + 1);
  std::vector<int> lost;
  for (int i = 0; i < static_cast<int>(g.bundles.size()); ++i) {
    const auto where = bundle_nodes[i] ? m.slot_of.find(*bundle_nodes[i]) : m.slot_of.end();
    if (where != m.slot_of.end() && m.fits(where->second, bundle_demand(g, i))) m.reserve_bundle(g, i, where->second);
    else lost.push_back(i);
  }
  CreateResult out{g.id, GroupState::kCreated, Status{}};
  if (!lost.empty()) {
    out.reason = m.explain_unplaced(g, lost);
    const bool none = lost.size() == g.bundles.size();
    out.state = g.state = none ? GroupState::kPending : GroupState::kRescheduling;
    (none ? m.pending : m.rescheduling).insert(g.id);
  } else {
    g.state = GroupState::kCreated;
  }
  m.groups.emplace(g.id, std::move(g));
  if (!lost.empty()) m.retry_waiting();   // its lost bundles may fit elsewhere at once
  return out;
}

Result<std::vector<ActorId>> Scheduler::remove_placement_group(PlacementGroupId id) {
  Impl& m = *impl_;
  auto it = m.groups.find(id);
  if (it == m.groups.end()) return Error{PlacementCode::NotFound, "no placement group " + std::to_string(id)};
  GroupRec& g = it->second;
  std::vector<ActorId> killed;
  for (int i = 0; i < static_cast<int>(g.bundles.size()); ++i) {
    for (ActorId a : std::vector<ActorId>(g.bundles[i].actors)) {
      killed.push_back(a);
      m.erase_actor(a, false);  // its resources return with the bundle
    }
    if (g.bundles[i].slot != kNoSlot) m.unreserve_bundle(g, i);
  }
  m.pending.erase(id);
  m.rescheduling.erase(id);
  std::erase(m.ready, id);
  m.groups.erase(it);
  m.retry_waiting();
  return killed;
}

std::vector<PlacementGroupId> Scheduler::take_ready_groups() { return std::exchange(impl_->ready, {}); }

std::string_view to_string(Strategy strategy) {
  switch (strategy) {
    case Strategy::kPack: return "PACK";
    case Strategy::kSpread: return "SPREAD";
    case Strategy::kStrictPack: return "STRICT_PACK";
    case Strategy::kStrictSpread: return "STRICT_SPREAD";
  }
  return "UNKNOWN";
}

Result<Strategy> parse_strategy(std::string_view text) {
  for (Strategy s : {Strategy::kPack, Strategy::kSpread, Strategy::kStrictPack, Strategy::kStrictSpread})
    if (to_string(s) == text) return s;
  return Error{PlacementCode::InvalidArgument,
                "unknown strategy '" + std::string(text) + "' (PACK, SPREAD, STRICT_PACK, STRICT_SPREAD)"};
}

std::string_view to_string(GroupState state) {
  switch (state) {
    case GroupState::kPending: return "PENDING";
    case GroupState::kCreated: return "CREATED";
    case GroupState::kRescheduling: return "RESCHEDULING";
  }
  return "UNKNOWN";
}

}  // namespace troupe::placement
