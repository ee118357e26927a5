// Nodes, the utilization index, the hybrid node choice, and actors.
#include <algorithm>
#include <cmath>

#include "scheduler_impl.hpp"

namespace troupe::placement {

using detail::Demand;
using detail::kBuckets;
using detail::kNoSlot;
using detail::NodeRec;
using detail::Shape;

namespace {

// Critical utilization of a node if `add` more were taken from `available`.
double utilization(const Resources& total, const Resources& available, const Resources* add) {
  double score = 0;
  auto a = available.entries().begin();
  const auto a_end = available.entries().end();
  for (const auto& e : total.entries()) {
    while (a != a_end && a->id < e.id) ++a;
    std::int64_t free = (a != a_end && a->id == e.id) ? a->amount.units() : 0;
    if (add) free -= add->get(e.id).units();
    score = std::max(score, static_cast<double>(e.amount.units() - free) / e.amount.units());
  }
  return score;
}

// Label-selected candidate sets up to this size are ranked exhaustively.
constexpr std::size_t kDirectScanLimit = 64;

int bucket_of(double score) {
  return std::clamp(static_cast<int>(std::floor(score * 100 + 1e-9)), 0, kBuckets - 1);
}

std::string label_key(const std::string& k, const std::string& v) { return k + "=" + v; }

}  // namespace

// Ray's rule: fractional GPU requests up to 1; above 1 only whole numbers.
Status detail::check_amounts(const Resources& r, const std::string& what) {
  if (r.any_negative()) return {PlacementCode::InvalidArgument, what + " has a negative amount: " + r.to_string()};
  const Quantity gpu = r.get(kGpu);
  if (gpu > Quantity::whole(1) && !gpu.is_whole())
    return {PlacementCode::InvalidArgument,
            what + " asks " + Resources().set(kGpu, gpu).to_string() + ": above 1 GPU only whole numbers can be placed"};
  return Status{};
}


// ---------------------------------------------------------------- index

void Scheduler::Impl::index_insert(std::uint32_t slot) {
  NodeRec& n = nodes[slot];
  Shape& s = shapes[n.shape];
  n.bucket = bucket_of(n.score);
  n.pos = static_cast<std::uint32_t>(s.buckets[n.bucket].size());
  s.buckets[n.bucket].push_back(slot);
  s.nonempty.set(n.bucket);
}

void Scheduler::Impl::index_erase(std::uint32_t slot) {
  NodeRec& n = nodes[slot];
  if (n.bucket < 0) return;
  auto& list = shapes[n.shape].buckets[n.bucket];
  const std::uint32_t moved = list.back();
  list[n.pos] = moved;
  nodes[moved].pos = n.pos;
  list.pop_back();
  if (list.empty()) shapes[n.shape].nonempty.reset(n.bucket);
  n.bucket = -1;
}

void Scheduler::Impl::index_refresh(std::uint32_t slot) {
  NodeRec& n = nodes[slot];
  n.score = utilization(n.total, n.available, nullptr);
  if (n.bucket >= 0 && n.bucket != bucket_of(n.score)) {
    index_erase(slot);
    index_insert(slot);
  }
}

bool Scheduler::Impl::fits(std::uint32_t slot, const Demand& d) const {
  const NodeRec& n = nodes[slot];
  if (n.state != NodeState::kAlive) return false;
  if (d.exclude && std::find(d.exclude->begin(), d.exclude->end(), slot) != d.exclude->end()) return false;
  if (!d.total.fits_in(n.available)) return false;
  if (d.gpu_parts.size() == 1 && !n.gpus.can_take(d.gpu_parts[0])) return false;
  if (d.gpu_parts.size() > 1 && !n.gpus.can_take_all(d.gpu_parts)) return false;
  return !d.selector || d.selector->matches(n.labels);
}

double Scheduler::Impl::post_score(std::uint32_t slot, const Resources& add) const {
  return utilization(nodes[slot].total, nodes[slot].available, &add);
}

// ---------------------------------------------------------------- hybrid choice

std::uint32_t Scheduler::Impl::pick_node(const Demand& d) const {
  // A kIn label term names its candidates through the label index. Few candidates (a pinned
  // host, a small pool): rank them all. Many (a zone): probe the utilization index with the
  // selector as a filter instead; its full-scan fallback still guarantees completeness.
  if (d.selector) {
    if (const LabelTerm* term = d.selector->first_in_term()) {
      std::vector<const std::vector<std::uint32_t>*> lists;
      std::size_t count = 0;
      for (const auto& v : term->values)
        if (auto it = label_index.find(label_key(term->key, v)); it != label_index.end())
          lists.push_back(&it->second), count += it->second.size();
      if (count <= kDirectScanLimit) {
        std::vector<std::uint32_t> candidates;
        for (const auto* list : lists) candidates.insert(candidates.end(), list->begin(), list->end());
        return scan_best(d, candidates);
      }
    }
  }
  const bool wants_gpu = d.total.get(kGpu).units() > 0;
  std::vector<int> preferred, others;
  for (int i = 0; i < static_cast<int>(shapes.size()); ++i) {
    if (shapes[i].nonempty.none() || !d.total.names_subset_of(shapes[i].names)) continue;
    const bool avoid = options.avoid_gpu_nodes && !wants_gpu && shapes[i].has_gpu;
    (avoid ? others : preferred).push_back(i);
  }
  const std::uint32_t slot = pick_in_shapes(d, preferred);
  return slot != kNoSlot ? slot : pick_in_shapes(d, others);
}

std::uint32_t Scheduler::Impl::pick_in_shapes(const Demand& d, const std::vector<int>& shape_ids) const {
  if (shape_ids.empty()) return kNoSlot;
  const double threshold = options.spread_threshold;
  const int top = bucket_of(threshold);
  const auto probes = static_cast<std::size_t>(std::max(1, options.probes_per_bucket));
  // Pack: the most utilized node that stays at or under the threshold.
  for (int b = top; b >= 0; --b)
    for (int s : shape_ids) {
      const auto& list = shapes[s].buckets[b];
      for (std::size_t k = 0; k < std::min(probes, list.size()); ++k) {
        const std::uint32_t slot = list[k];
        if (nodes[slot].score < threshold && fits(slot, d) && post_score(slot, d.total) <= threshold) return slot;
      }
    }
  // Spread: the least utilized node that fits.
  for (int b = 0; b < kBuckets; ++b)
    for (int s : shape_ids) {
      const auto& list = shapes[s].buckets[b];
      for (std::size_t k = 0; k < std::min(probes, list.size()); ++k)
        if (fits(list[k], d)) return list[k];
    }
  // The probes found nothing: scan everything so that a node that fits is never missed.
  std::vector<std::uint32_t> all;
  for (int s : shape_ids)
    for (const auto& list : shapes[s].buckets) all.insert(all.end(), list.begin(), list.end());
  return scan_best(d, all);
}

std::uint32_t Scheduler::Impl::scan_best(const Demand& d, const std::vector<std::uint32_t>& slots) const {
  const double threshold = options.spread_threshold;
  std::uint32_t best = kNoSlot;
  std::pair<int, double> best_rank{2, 0};
  for (std::uint32_t slot : slots) {
    if (!fits(slot, d)) continue;
    const double post = post_score(slot, d.total);
    const bool pack = nodes[slot].score < threshold && post <= threshold;
    const std::pair<int, double> rank = pack ? std::pair(0, -post) : std::pair(1, nodes[slot].score);
    if (rank < best_rank) best = slot, best_rank = rank;
  }
  return best;
}

bool Scheduler::Impl::fits_some_total(const Demand& d) const {
  for (const NodeRec& n : nodes) {
    if (n.state != NodeState::kAlive || !d.total.fits_in(n.total)) continue;
    if (d.selector && !d.selector->matches(n.labels)) continue;
    if (detail::GpuPool::for_node(n.total.get(kGpu)).can_take_all(d.gpu_parts)) return true;
  }
  return false;
}

void Scheduler::Impl::take_from_node(std::uint32_t slot, const Resources& r) {
  NodeRec& n = nodes[slot];
  n.available -= r;
  if (n.state == NodeState::kAlive) free_total -= r;
  index_refresh(slot);
}

void Scheduler::Impl::give_to_node(std::uint32_t slot, const Resources& r) {
  NodeRec& n = nodes[slot];
  if (n.state == NodeState::kDead) return;
  n.available += r;
  if (n.state == NodeState::kAlive) free_total += r;
  index_refresh(slot);
}

// ---------------------------------------------------------------- nodes

Scheduler::Scheduler(SchedulerOptions options) : impl_(std::make_unique<Impl>(options)) {}
Scheduler::~Scheduler() = default;
Scheduler::Scheduler(Scheduler&&) noexcept = default;
Scheduler& Scheduler::operator=(Scheduler&&) noexcept = default;

Status Scheduler::add_node(NodeId id, Resources total, Labels labels) {
  Impl& m = *impl_;
  if (auto it = m.slot_of.find(id); it != m.slot_of.end())
    return {PlacementCode::AlreadyExists, "node " + std::to_string(id) + " is already known (" +
                                            std::string(to_string(m.nodes[it->second].state)) +
                                            "); a returning node joins under a new id (FT-3)"};
  TROUPE_RETURN_IF_ERROR(detail::check_amounts(total, "node " + std::to_string(id)));
  Resources names;
  for (const auto& e : total.entries()) names.set(e.id, Quantity::whole(1));
  auto shape = std::find_if(m.shapes.begin(), m.shapes.end(), [&](const Shape& s) { return s.names == names; });
  if (shape == m.shapes.end()) {
    shape = m.shapes.insert(m.shapes.end(), Shape{});
    shape->names = names;
    shape->has_gpu = total.get(kGpu).units() > 0;
  }
  const auto slot = static_cast<std::uint32_t>(m.nodes.size());
  NodeRec& n = m.nodes.emplace_back();
  n.id = id;
  n.total = total;
  n.available = total;
  n.labels = std::move(labels);
  n.gpus = detail::GpuPool::for_node(total.get(kGpu));
  n.shape = static_cast<int>(shape - m.shapes.begin());
  m.slot_of.emplace(id, slot);
  m.index_insert(slot);
  for (const auto& [k, v] : n.labels) m.label_index[label_key(k, v)].push_back(slot);
  m.free_total += total;
  m.retry_waiting();
  return Status{};
}

namespace {
void unindex_labels(Scheduler::Impl& m, std::uint32_t slot) {
  for (const auto& [k, v] : m.nodes[slot].labels) std::erase(m.label_index[label_key(k, v)], slot);
}
}  // namespace

Status Scheduler::drain_node(NodeId id) {
  Impl& m = *impl_;
  auto it = m.slot_of.find(id);
  if (it == m.slot_of.end()) return {PlacementCode::NotFound, "no node " + std::to_string(id)};
  NodeRec& n = m.nodes[it->second];
  if (n.state == NodeState::kDead) return {PlacementCode::FailedPrecondition, "node " + std::to_string(id) + " is dead"};
  if (n.state == NodeState::kDraining) return Status{};
  m.index_erase(it->second);
  unindex_labels(m, it->second);
  m.free_total -= n.available;
  n.state = NodeState::kDraining;
  return Status{};
}

Result<NodeLoss> Scheduler::mark_dead(NodeId id) {
  Impl& m = *impl_;
  auto it = m.slot_of.find(id);
  if (it == m.slot_of.end()) return Error{PlacementCode::NotFound, "no node " + std::to_string(id)};
  const std::uint32_t slot = it->second;
  NodeRec& n = m.nodes[slot];
  if (n.state == NodeState::kDead) return Error{PlacementCode::FailedPrecondition, "node " + std::to_string(id) + " is already dead"};
  if (n.state == NodeState::kAlive) {
    m.index_erase(slot);
    unindex_labels(m, slot);
    m.free_total -= n.available;
  }
  n.state = NodeState::kDead;
  NodeLoss loss;
  const std::set<PlacementGroupId> affected = m.release_dead_node(slot, loss.lost_actors);
  // Re-reserve the lost bundles before anything else can take the room (§5).
  for (PlacementGroupId gid : affected) {
    detail::GroupRec& g = m.groups.at(gid);
    std::vector<int> todo;
    for (int i = 0; i < static_cast<int>(g.bundles.size()); ++i)
      if (g.bundles[i].slot == kNoSlot) todo.push_back(i);
    const bool placed = m.place_bundles(g, todo);
    g.state = placed ? GroupState::kCreated : GroupState::kRescheduling;
    if (placed) m.rescheduling.erase(gid);
    else m.rescheduling.insert(gid);
    (placed ? loss.re_reserved : loss.rescheduling).push_back(gid);
  }
  return loss;
}

std::set<PlacementGroupId> Scheduler::Impl::release_dead_node(std::uint32_t slot, std::vector<ActorId>& lost) {
  NodeRec& n = nodes[slot];
  for (ActorId a : std::vector<ActorId>(n.actors)) {
    lost.push_back(a);
    erase_actor(a, false);
  }
  std::set<PlacementGroupId> affected;
  for (auto [gid, index] : std::vector<std::pair<PlacementGroupId, int>>(n.bundles)) {
    detail::GroupRec& g = groups.at(gid);
    for (ActorId a : std::vector<ActorId>(g.bundles[index].actors)) {
      lost.push_back(a);
      erase_actor(a, false);
    }
    unreserve_bundle(g, index);
    affected.insert(gid);
  }
  return affected;
}

std::string_view to_string(NodeState state) {
  switch (state) {
    case NodeState::kAlive: return "ALIVE";
    case NodeState::kDraining: return "DRAINING";
    case NodeState::kDead: return "DEAD";
  }
  return "UNKNOWN";
}

}  // namespace troupe::placement
