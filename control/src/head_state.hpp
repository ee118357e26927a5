// The typed head: its five tables and the scheduler, and every state transition between them.
// Nodes join and die; workers start and exit; actors are placed, started, restarted (same id, next
// incarnation: FT-2) or buried; placement groups reserve bundles (PG-1, PG-2); jobs' drivers are
// placed like actors, started by a node's daemon, retried up to their attempts, and what a job
// owns goes when it ends (JOB-1). Built on a store,
// it loads the tables that store holds first (a head can reload): nodes that were alive get
// node_timeout to be heard from again, groups and actors are put back where they were recorded.
// No HTTP and no JSON here: head.cpp adapts requests to these calls. Not thread-safe: the head's
// mutex serializes every call.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "head_tables.hpp"
#include "troupe/placement/elastic.hpp"
#include "troupe/placement/scheduler.hpp"

namespace troupe::control {

// What a worker reports of one of its actors.
struct ActorEvent {
  enum class Kind : std::uint8_t {
    Ready,     // its constructor returned
    Failed,    // its constructor threw (reason)
    Drained,   // the calls queued to it before a drain order have all finished
  };
  std::uint64_t actor = 0;
  std::uint64_t incarnation = 0;
  Kind kind = Kind::Failed;
  std::string reason;
};

class HeadState {
 public:
  explicit HeadState(Store& store);   // loads the store's tables

  // Nodes.
  Result<std::uint64_t> register_node(NodeRecord rec);   // rec.total must be valid; the id is assigned
  // A node's daemon was heard from (its link is open): it is alive. NotFound for an unknown id.
  Result<NodeState> node_seen(std::uint64_t id);
  std::vector<NodeCommand> take_node_commands(std::uint64_t id);
  Status worker_exited(std::uint64_t node, std::uint64_t worker, const std::string& how);
  // Its daemon is gone (its link ended): the node dies now. NotFound for an unknown id.
  Status node_gone(std::uint64_t id, const std::string& why);
  // Nodes not heard from for `timeout` die; true when one did.
  bool expire_nodes(std::chrono::milliseconds timeout);
  // Drains an alive node: it takes nothing new; its elastic members leave their groups' epochs at
  // once and stop once the calls they have started and those queued to them have finished (their
  // worker reports it: ActorEvent::Kind::Drained), or at the deadline; workers whose
  // actors all have restarts left are moved now (restarted elsewhere); the rest is waited for up to
  // `deadline`, then stopped and listed. Drained once nothing is left: its bundles are reserved
  // elsewhere and it can be stopped. NotFound, Conflict for a dead node; idempotent.
  Result<const NodeRecord*> drain_node(std::uint64_t id, std::chrono::milliseconds deadline);
  // Moves drains on at `now`; true when anything changed. The next time it has to look, if any.
  bool advance_drains(SteadyTime now);
  std::optional<SteadyTime> next_drain_time();

  // Workers.
  Result<WorkerState> worker_ready(std::uint64_t id, std::string gateway, std::int64_t pid);
  Result<WorkerState> worker_state(std::uint64_t id);
  std::vector<WorkerCommand> take_worker_commands(std::uint64_t id);
  Status actor_events(std::uint64_t worker, const std::vector<ActorEvent>& events);

  // Actors. create: Conflict when colocate_with names an actor that is not running.
  Result<const ActorRecord*> create_actor(SpawnSpec spec);
  // An actor another process runs itself (a driver's in-process actor passed to a worker): alive
  // at once at `gateway`, no resources, no worker, never restarted; it goes with its owner.
  const ActorRecord* host_actor(SpawnSpec spec, std::string gateway, std::int64_t pid);
  Result<const ActorRecord*> kill_actor(std::uint64_t id, const std::string& reason);
  const ActorRecord* actor(std::uint64_t id);

  // Placement groups. create: BadRequest for a bad spec, Conflict when it cannot be placed and
  // may not wait. remove: NotFound; otherwise the actors it killed.
  Result<placement::CreateResult> create_group(placement::PlacementGroupSpec spec, std::uint64_t owner = 0);
  Result<std::vector<placement::ActorId>> remove_group(std::uint64_t id);
  std::optional<placement::GroupView> group(std::uint64_t id) const { return scheduler_.group(id); }

  // Owners (JOB-1): a driver's link gets one; what it creates goes when the link ends.
  std::uint64_t new_owner() { return owners_.next(); }

  // Jobs. submit: the job and true, or the job already submitted under the same submission id
  // with the same spec and false; Conflict for that id with another spec.
  Result<std::pair<const JobRecord*, bool>> submit_job(JobSpec spec);
  // A job that never started is Stopped at once; a started one's driver is sent SIGTERM (SIGKILL
  // after `grace_ms`) and the job is Stopped when it has exited. An ended job is left as it is.
  Result<const JobRecord*> stop_job(std::uint64_t id, std::int64_t grace_ms);
  // Removes an ended job's record: NotFound, or Conflict for a live one.
  Status delete_job(std::uint64_t id);
  // Its driver's runtime joined (TROUPE_JOB_ID, TROUPE_JOB_ATTEMPT): Running; returns the owner id
  // of what the attempt creates. Conflict when that attempt is not the one starting.
  Result<std::uint64_t> driver_connected(std::uint64_t job, std::int64_t attempt, std::int64_t pid);
  // What a node's daemon reports of a driver it was told to start: its pid, a step while it is
  // being started (fetching its package), its end ("exit N", "signal N", or why it could not start).
  void driver_started(std::uint64_t node, std::uint64_t job, std::int64_t attempt, std::int64_t pid);
  void driver_progress(std::uint64_t node, std::uint64_t job, std::int64_t attempt, const std::string& message);
  void driver_exited(std::uint64_t node, std::uint64_t job, std::int64_t attempt, const std::string& how);
  JobManager& jobs() { return jobs_; }

  // Elastic groups. create: BadRequest unless 1 <= min <= max <= 1000; the target starts at max.
  // scale: a new target (clamped to nothing: out of [min, max] is a BadRequest), or new bounds
  // (the target is kept within them). Members are started, placed by the deficit rule, replaced
  // when they die, and stopped (the newest first, waiting ones before running ones) past the target.
  Result<const ElasticGroupRecord*> create_elastic(ElasticGroupRecord g);
  Result<const ElasticGroupRecord*> scale_elastic(std::uint64_t id, std::optional<std::int64_t> target,
                                                  std::optional<std::int64_t> min, std::optional<std::int64_t> max);
  // Removes the group and stops its members; the number stopped. NotFound for an unknown id.
  Result<std::size_t> remove_elastic(std::uint64_t id);
  const std::map<std::uint64_t, ElasticGroupRecord>& elastic_groups() const { return elastic_; }
  // Its members running now, and why it has fewer than its target ("" when it does not).
  std::int64_t elastic_live(const ElasticGroupRecord& g);
  std::string elastic_reason(const ElasticGroupRecord& g);
  // The jobs that ended since the last call.
  std::vector<std::uint64_t> take_ended_jobs() { return std::exchange(ended_jobs_, {}); }
  // Kills the owner's actors and removes its placement groups; how many of each.
  std::pair<std::size_t, std::size_t> owner_gone(std::uint64_t owner, const std::string& why);

  NodeManager& nodes() { return nodes_; }
  WorkerManager& workers() { return workers_; }
  ActorManager& actors() { return actors_; }
  const GroupManager& groups() const { return groups_; }
  // What is free on a node now, or nullopt for a dead or unknown one.
  std::optional<placement::Resources> available(std::uint64_t node) const;

 private:
  using Worker = WorkerManager::Worker;

  void load(Store& store);
  void restore_actor(ActorRecord& a);
  void place_and_start(ActorRecord& a);
  Worker& worker_for(const placement::Placement& p, const SpawnSpec& spec);
  void start_on_worker(Worker& w, ActorRecord& a);
  void release(ActorRecord& a);                 // gives its resources back to the scheduler
  void on_worker_lost(Worker& w, const std::string& why);
  void bury(ActorRecord& a, const std::string& why);
  void retire(Worker& w);   // tells it to exit: its last actor went
  void restart_or_bury(ActorRecord& a, const std::string& why, std::map<std::uint64_t, Worker*>& regroup);
  void node_dead(NodeManager::Node& n, const std::string& why);
  void after_release();                         // room came free: waiting groups, then waiting actors
  void save_group(std::uint64_t id);
  void schedule_jobs();                         // places waiting jobs' drivers and orders their start
  void place_pending();                         // waiting actors: plain ones by id, then elastic members by deficit
  bool reconcile_elastic();                     // members started or stopped toward each target; true if any
  placement::ElasticDemand demand(const ElasticGroupRecord& g);
  // The current attempt of `j` ended: what it owns goes; it is retried, or the job ends.
  void attempt_ended(JobRecord& j, std::optional<int> exit_code, std::optional<int> signal, const std::string& why);
  JobRecord* launched_job(std::uint64_t node, std::uint64_t job, std::int64_t attempt);

  placement::Scheduler scheduler_;
  NodeManager nodes_;
  WorkerManager workers_;
  ActorManager actors_;
  GroupManager groups_;
  JobManager jobs_;
  IdSequence owners_;
  std::vector<std::uint64_t> ended_jobs_;
  std::map<std::uint64_t, ElasticGroupRecord> elastic_;   // not stored: they go with their drivers
  std::uint64_t next_elastic_ = 1;
};

}  // namespace troupe::control
