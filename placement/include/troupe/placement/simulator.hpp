// The simulator: the real Scheduler over N fake nodes, driven by random churn (nodes join,
// leave gracefully, die; actors and groups come and go), with elastic groups kept at their
// targets by the head's controller (elastic.hpp). Deterministic for a given seed.
// Used for scale tests (invariants under churn) and for the placement benchmark.
//
// Thread safety: none (it owns a Scheduler, which has none).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <random>
#include <unordered_map>
#include <vector>

#include "troupe/placement/elastic.hpp"
#include "troupe/placement/scheduler.hpp"

namespace troupe::placement {

// One kind of actor the simulator places, with its relative weight.
struct ActorShape {
  Resources resources;
  double weight = 1;
};

struct SimulatorOptions {
  std::uint64_t seed = 1;
  std::size_t initial_nodes = 100;
  Resources gpu_node = Resources::must_parse("CPU=64,GPU=8,memory=512G,accel_type:H200=8");
  Resources cpu_node = Resources::must_parse("CPU=32,memory=128G");
  double gpu_node_fraction = 0.5;  // of joining nodes
  std::size_t zones = 4;           // nodes carry label zone=z0..z{zones-1}
  std::size_t leave_delay = 16;    // steps a leaving node drains before it is gone
  // What place_random_actor() asks for: ~1.25 CPU and ~0.35 GPU per actor on average.
  std::vector<ActorShape> actor_shapes = {
      {Resources::must_parse("CPU=1"), 50},
      {Resources::must_parse("CPU=1,GPU=0.5"), 20},
      {Resources::must_parse("CPU=2,GPU=1"), 15},
      {Resources::must_parse("CPU=0.5,memory=8G"), 10},
      {Resources::must_parse("CPU=4,GPU=2,accel_type:H200=0.001"), 5}};
  double zone_pinned_fraction = 0.1;  // actors that also ask for one zone label
  SchedulerOptions scheduler;
};

// Relative weights of the events step() draws.
struct ChurnMix {
  double join = 1, leave = 1, die = 1;
  double place = 40, release = 30;
  double create_group = 4, remove_group = 3, place_in_group = 8;
};

// An elastic group of the simulation: `target` members of one shape (a job's rollout group).
struct SimElasticGroup {
  std::uint64_t id = 0;
  std::int64_t target = 0;
  Resources shape;
  std::vector<ActorId> members;   // oldest first
};

struct SimStats {
  std::uint64_t steps = 0, joins = 0, leaves = 0, deaths = 0;
  std::uint64_t elastic_started = 0, elastic_stopped = 0, elastic_lost = 0;
  std::uint64_t placed = 0, place_failed = 0, released = 0, lost_actors = 0;
  std::uint64_t groups_created = 0, groups_pending = 0, groups_removed = 0, groups_rejected = 0;
};

class Simulator {
 public:
  explicit Simulator(SimulatorOptions options = {});

  Scheduler& scheduler() { return scheduler_; }
  const SimStats& stats() const { return stats_; }
  std::mt19937_64& rng() { return rng_; }

  // A fresh node (GPU or CPU shape per gpu_node_fraction); ids are never reused (FT-3).
  NodeId join();
  // Graceful: drain now, gone after leave_delay steps.
  void leave(NodeId node);
  void die(NodeId node);
  // A random actor (mix of CPU-only, fractional-GPU, whole-GPU, memory-heavy, zone-pinned).
  bool place_random_actor();
  bool release_random_actor();
  bool create_random_group();
  bool remove_random_group();
  bool place_random_actor_in_group();

  // Elastic groups, kept at their targets as the head keeps a job's: past its target a group's
  // newest members stop; room goes to the groups below theirs by the deficit rule (elastic_fill).
  // reconcile_elastic() applies both now and returns the members started and stopped; step()
  // calls it after every event. Members lost with a node leave their group (and are replaced).
  std::uint64_t add_elastic_group(std::int64_t target, Resources shape);
  bool set_elastic_target(std::uint64_t group, std::int64_t target);   // false: no such group
  std::size_t reconcile_elastic();
  const SimElasticGroup* elastic_group(std::uint64_t id) const;

  // One random event drawn from `mix`, then any due departures, then reconcile_elastic().
  void step(const ChurnMix& mix = {});

  std::size_t alive_nodes() const { return alive_.size(); }
  const std::vector<ActorId>& actors() const { return actors_; }

 private:
  NodeId pick_alive();
  void forget_actors(const std::vector<ActorId>& ids);
  void lost(const std::vector<ActorId>& ids);   // with their node: out of actors_ and elastic groups
  void forget_node(NodeId node);
  void track_actor(ActorId id);

  SimulatorOptions options_;
  Scheduler scheduler_;
  std::mt19937_64 rng_;
  SimStats stats_;
  NodeId next_node_ = 1;
  ActorId next_actor_ = 1;
  std::vector<NodeId> alive_;
  std::unordered_map<NodeId, std::size_t> alive_pos_;
  std::vector<ActorId> actors_;
  std::unordered_map<ActorId, std::size_t> actor_pos_;
  std::vector<PlacementGroupId> groups_;
  std::deque<std::pair<std::uint64_t, NodeId>> leaving_;  // (due step, node)
  std::discrete_distribution<std::size_t> shape_pick_;
  std::map<std::uint64_t, SimElasticGroup> elastic_;
  std::unordered_map<ActorId, std::uint64_t> elastic_of_;   // member -> its group
  std::uint64_t next_elastic_ = 1;
};

}  // namespace troupe::placement
