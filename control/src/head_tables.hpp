// The head's tables, one manager each: nodes, workers, actors, placement groups, jobs. A manager holds
// its records (numeric ids, enum states), hands out ids (kept in the store's meta, so that a head
// started on the same store never reuses one) and writes its records through to the store. The
// transitions that touch several tables are HeadState's. Not thread-safe: the head's mutex
// serializes every call.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>

#include "troupe/control/records.hpp"
#include "troupe/control/store.hpp"
#include "troupe/placement/placement_group.hpp"

namespace troupe::control {

using SteadyTime = std::chrono::steady_clock::time_point;

// An id counter whose next value lives in the store's meta under `key`.
class IdSequence {
 public:
  IdSequence(Store& store, std::string key);
  std::uint64_t next();                    // returns it and stores the one after
  std::uint64_t peek() const { return next_; }
  void at_least(std::uint64_t next);       // ids below `next` are taken (loaded records)

 private:
  Store& store_;
  std::string key_;
  std::uint64_t next_ = 1;
};

class NodeManager {
 public:
  struct Node {
    NodeRecord rec;
    std::deque<NodeCommand> commands;
    SteadyTime last_seen;
    SteadyTime drain_deadline{};   // Draining: when it ends at the latest
  };

  explicit NodeManager(Store& store) : store_(store), ids_(store, "next_node") {}
  Node& add(NodeRecord rec);               // a new node: the next id
  std::uint64_t next_id() const { return ids_.peek(); }
  Node& restore(const NodeRecord& rec);    // one loaded from the store: its own id
  Node* find(std::uint64_t id);
  std::map<std::uint64_t, Node>& all() { return nodes_; }
  void save(const Node& n);
  // Queues a command for an alive node's daemon; dropped for a dead one.
  void command(std::uint64_t id, NodeCommand c);

 private:
  Store& store_;
  IdSequence ids_;
  std::map<std::uint64_t, Node> nodes_;
};

// Worker processes are not stored: they are known again from their actors' records.
class WorkerManager {
 public:
  struct Worker {
    std::uint64_t id = 0;
    std::uint64_t node = 0;
    WorkerState state = WorkerState::Starting;
    std::string gateway;                   // its link address, once ready
    std::int64_t pid = 0;
    std::set<std::uint64_t> actors;
    std::deque<WorkerCommand> commands;
    bool exiting = false;   // told to exit (its last actor went): no new actor goes to it
  };

  explicit WorkerManager(Store& store) : ids_(store, "next_worker") {}
  Worker& add(std::uint64_t node);
  Worker& restore(std::uint64_t id, std::uint64_t node);   // the existing one, or a new one with that id
  Worker* find(std::uint64_t id);
  std::map<std::uint64_t, Worker>& all() { return workers_; }
  // The worker of placement's process key (colocated actors share one), while it is not dead or
  // exiting.
  Worker* for_process(std::uint64_t key);
  void bind_process(std::uint64_t key, std::uint64_t worker) { process_workers_[key] = worker; }

 private:
  IdSequence ids_;
  std::map<std::uint64_t, Worker> workers_;
  std::map<std::uint64_t, std::uint64_t> process_workers_;
};

class ActorManager {
 public:
  explicit ActorManager(Store& store) : store_(store), ids_(store, "next_actor") {}
  ActorRecord& add(SpawnSpec spec);        // a new actor, Pending: the next id
  ActorRecord& restore(ActorRecord rec);
  ActorRecord* find(std::uint64_t id);
  std::map<std::uint64_t, ActorRecord>& all() { return actors_; }
  // Writes the record through, and marks it changed: every change of an actor is saved.
  void save(const ActorRecord& a);
  // The actors saved since the last call (what drivers have not been told yet).
  std::set<std::uint64_t> take_changed() { return std::exchange(changed_, {}); }

 private:
  Store& store_;
  IdSequence ids_;
  std::map<std::uint64_t, ActorRecord> actors_;
  std::set<std::uint64_t> changed_;
};

// The groups' records; their live reservations are the scheduler's, and a record is refreshed
// from the scheduler's view whenever a reservation moves.
class GroupManager {
 public:
  explicit GroupManager(Store& store) : store_(store) {}
  // A new record takes `owner`; an existing one keeps its own.
  void put(const placement::GroupView& g, bool wait_if_unplaced, std::uint64_t owner = 0);
  void remove(std::uint64_t id);
  const GroupRecord* find(std::uint64_t id) const;
  const std::map<std::uint64_t, GroupRecord>& all() const { return groups_; }
  void restore(GroupRecord rec) { groups_[rec.id] = std::move(rec); }

 private:
  Store& store_;
  std::map<std::uint64_t, GroupRecord> groups_;
};

class JobManager {
 public:
  explicit JobManager(Store& store) : store_(store), ids_(store, "next_job") {}
  JobRecord& add(JobSpec spec);            // a new job, Pending: the next id
  JobRecord& restore(JobRecord rec);
  JobRecord* find(std::uint64_t id);
  JobRecord* find_submission(const std::string& submission_id);   // "" finds none
  std::map<std::uint64_t, JobRecord>& all() { return jobs_; }
  void save(const JobRecord& j);
  void remove(std::uint64_t id);

 private:
  Store& store_;
  IdSequence ids_;
  std::map<std::uint64_t, JobRecord> jobs_;
};

}  // namespace troupe::control
