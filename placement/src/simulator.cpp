#include "troupe/placement/simulator.hpp"

#include <algorithm>

namespace troupe::placement {
namespace {

template <class T>
void swap_remove(std::vector<T>& list, std::unordered_map<T, std::size_t>& pos, T value) {
  auto it = pos.find(value);
  if (it == pos.end()) return;
  const T moved = list.back();
  list[it->second] = moved;
  pos[moved] = it->second;
  list.pop_back();
  pos.erase(value);
}

// "z3". Built by append: GCC 12 warns falsely (-Wrestrict) on "z" + std::to_string(i).
std::string zone_name(std::uint64_t i) {
  std::string out = "z";
  out += std::to_string(i);
  return out;
}

}  // namespace

Simulator::Simulator(SimulatorOptions options)
    : options_(std::move(options)), scheduler_(options_.scheduler), rng_(options_.seed) {
  std::vector<double> weights;
  for (const ActorShape& a : options_.actor_shapes) weights.push_back(a.weight);
  shape_pick_ = std::discrete_distribution<std::size_t>(weights.begin(), weights.end());
  for (std::size_t i = 0; i < options_.initial_nodes; ++i) join();
}

NodeId Simulator::join() {
  const NodeId id = next_node_++;
  const bool gpu = std::bernoulli_distribution(options_.gpu_node_fraction)(rng_);
  Labels labels{{"zone", zone_name(id % std::max<std::size_t>(1, options_.zones))}};
  if (!scheduler_.add_node(id, gpu ? options_.gpu_node : options_.cpu_node, std::move(labels)).ok()) return 0;
  alive_pos_[id] = alive_.size();
  alive_.push_back(id);
  ++stats_.joins;
  return id;
}

NodeId Simulator::pick_alive() {
  if (alive_.empty()) return 0;
  return alive_[std::uniform_int_distribution<std::size_t>(0, alive_.size() - 1)(rng_)];
}

void Simulator::forget_node(NodeId node) { swap_remove(alive_, alive_pos_, node); }

void Simulator::forget_actors(const std::vector<ActorId>& ids) {
  for (ActorId a : ids) swap_remove(actors_, actor_pos_, a);
}

void Simulator::track_actor(ActorId id) {
  actor_pos_[id] = actors_.size();
  actors_.push_back(id);
  ++stats_.placed;
}

void Simulator::lost(const std::vector<ActorId>& ids) {
  forget_actors(ids);
  stats_.lost_actors += ids.size();
  for (ActorId a : ids) {
    auto it = elastic_of_.find(a);
    if (it == elastic_of_.end()) continue;
    auto& members = elastic_.at(it->second).members;
    members.erase(std::find(members.begin(), members.end(), a));
    elastic_of_.erase(it);
    ++stats_.elastic_lost;
  }
}

std::uint64_t Simulator::add_elastic_group(std::int64_t target, Resources shape) {
  const std::uint64_t id = next_elastic_++;
  elastic_.emplace(id, SimElasticGroup{id, std::max<std::int64_t>(0, target), std::move(shape), {}});
  return id;
}

bool Simulator::set_elastic_target(std::uint64_t group, std::int64_t target) {
  auto it = elastic_.find(group);
  if (it == elastic_.end()) return false;
  it->second.target = std::max<std::int64_t>(0, target);
  return true;
}

const SimElasticGroup* Simulator::elastic_group(std::uint64_t id) const {
  auto it = elastic_.find(id);
  return it == elastic_.end() ? nullptr : &it->second;
}

std::size_t Simulator::reconcile_elastic() {
  std::size_t changes = 0;
  std::vector<ElasticDemand> demands;
  demands.reserve(elastic_.size());
  for (auto& [id, g] : elastic_) {
    ElasticDemand d{id, g.target, std::int64_t(g.members.size()), 0};
    for (auto delta = elastic_delta(d); delta < 0 && !g.members.empty(); ++delta) {   // the newest go
      (void)scheduler_.release_actor(g.members.back());
      elastic_of_.erase(g.members.back());
      g.members.pop_back();
      ++stats_.elastic_stopped;
      ++changes;
    }
    d.live = std::int64_t(g.members.size());
    demands.push_back(d);
  }
  changes += elastic_fill(demands, [this](const ElasticDemand& d) {
    SimElasticGroup& g = elastic_.at(d.group);
    const ActorId id = next_actor_++;
    if (!scheduler_.place_actor(ActorRequest{id, g.shape, std::nullopt, false, {}, std::nullopt}).ok()) return false;
    g.members.push_back(id);
    elastic_of_[id] = g.id;
    ++stats_.elastic_started;
    return true;
  });
  return changes;
}

void Simulator::leave(NodeId node) {
  if (!scheduler_.drain_node(node).ok()) return;
  forget_node(node);
  leaving_.emplace_back(stats_.steps + options_.leave_delay, node);
  ++stats_.leaves;
}

void Simulator::die(NodeId node) {
  auto loss = scheduler_.mark_dead(node);
  if (!loss.ok()) return;
  forget_node(node);
  lost(loss->lost_actors);
  ++stats_.deaths;
}

bool Simulator::place_random_actor() {
  if (options_.actor_shapes.empty()) return false;
  ActorRequest req{next_actor_++, options_.actor_shapes[shape_pick_(rng_)].resources, std::nullopt, false, {}, std::nullopt};
  if (std::bernoulli_distribution(options_.zone_pinned_fraction)(rng_))
    req.selector = LabelSelector::equals("zone", zone_name(rng_() % std::max<std::size_t>(1, options_.zones)));
  auto placed = scheduler_.place_actor(req);
  if (!placed.ok()) return ++stats_.place_failed, false;
  track_actor(req.actor);
  return true;
}

bool Simulator::release_random_actor() {
  if (actors_.empty()) return false;
  const ActorId a = actors_[std::uniform_int_distribution<std::size_t>(0, actors_.size() - 1)(rng_)];
  if (!scheduler_.release_actor(a).ok()) return false;
  forget_actors({a});
  ++stats_.released;
  return true;
}

bool Simulator::create_random_group() {
  static const Resources kBundles[] = {Resources::must_parse("CPU=1,GPU=1"), Resources::must_parse("CPU=4"),
                                       Resources::must_parse("CPU=2,GPU=0.5")};
  PlacementGroupSpec spec;
  const int n = std::uniform_int_distribution<int>(1, 8)(rng_);
  const Resources& shape = kBundles[std::uniform_int_distribution<int>(0, 2)(rng_)];
  spec.bundles.assign(n, shape);
  spec.strategy = static_cast<Strategy>(std::uniform_int_distribution<int>(0, 3)(rng_));
  spec.wait_if_unplaced = std::bernoulli_distribution(0.5)(rng_);
  auto created = scheduler_.create_placement_group(std::move(spec));
  if (!created.ok()) return ++stats_.groups_rejected, false;
  groups_.push_back(created->id);
  ++(created->state == GroupState::kCreated ? stats_.groups_created : stats_.groups_pending);
  return true;
}

bool Simulator::remove_random_group() {
  if (groups_.empty()) return false;
  const std::size_t i = std::uniform_int_distribution<std::size_t>(0, groups_.size() - 1)(rng_);
  auto killed = scheduler_.remove_placement_group(groups_[i]);
  groups_[i] = groups_.back();
  groups_.pop_back();
  if (!killed.ok()) return false;
  forget_actors(*killed);
  ++stats_.groups_removed;
  return true;
}

bool Simulator::place_random_actor_in_group() {
  if (groups_.empty()) return false;
  const PlacementGroupId g = groups_[std::uniform_int_distribution<std::size_t>(0, groups_.size() - 1)(rng_)];
  auto view = scheduler_.group(g);
  if (!view) return false;
  const int index = std::uniform_int_distribution<int>(0, static_cast<int>(view->bundles.size()) - 1)(rng_);
  Resources want = Resources::must_parse("CPU=0.5");
  if (view->bundles[index].get(kGpu).units() > 0) want.set(kGpu, Quantity::from_double(0.25));
  ActorRequest req{next_actor_++, want, BundleRef{g, index}, std::bernoulli_distribution(0.5)(rng_), {}, std::nullopt};
  if (!scheduler_.place_actor(req).ok()) return ++stats_.place_failed, false;
  track_actor(req.actor);
  return true;
}

void Simulator::step(const ChurnMix& mix) {
  const double weights[] = {mix.join, mix.leave, mix.die, mix.place, mix.release,
                            mix.create_group, mix.remove_group, mix.place_in_group};
  std::discrete_distribution<int> pick(std::begin(weights), std::end(weights));
  switch (pick(rng_)) {
    case 0: join(); break;
    case 1: if (NodeId n = pick_alive()) leave(n); break;
    case 2: if (NodeId n = pick_alive()) die(n); break;
    case 3: place_random_actor(); break;
    case 4: release_random_actor(); break;
    case 5: create_random_group(); break;
    case 6: remove_random_group(); break;
    case 7: place_random_actor_in_group(); break;
  }
  ++stats_.steps;
  while (!leaving_.empty() && leaving_.front().first <= stats_.steps) {
    auto loss = scheduler_.mark_dead(leaving_.front().second);
    if (loss.ok()) lost(loss->lost_actors);
    leaving_.pop_front();
  }
  if (!elastic_.empty()) reconcile_elastic();
}

}  // namespace troupe::placement
