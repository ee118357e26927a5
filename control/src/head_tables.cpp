#include "head_tables.hpp"

#include <spdlog/spdlog.h>

#include "troupe/ids.hpp"

namespace troupe::control {
namespace {

// A failed write is logged, not thrown: the head's memory stays the truth it serves, and the
// next write of the same record carries it again.
template <class F>
void write(const char* what, F&& f) {
  try {
    f();
  } catch (const ErrorException& e) {   // ControlCode::Store
    spdlog::error("head: cannot store {}: {}", what, e.what());
  }
}

}  // namespace

IdSequence::IdSequence(Store& store, std::string key) : store_(store), key_(std::move(key)) {
  try {
    if (auto v = store_.get_meta(key_)) next_ = std::max<std::uint64_t>(1, std::stoull(*v));
  } catch (const std::logic_error&) {   // not a number: ids restart above the loaded records
    spdlog::warn("head: the store's {} is not a number; ids continue above the stored records", key_);
  }
}

std::uint64_t IdSequence::next() {
  const std::uint64_t id = next_++;
  write(key_.c_str(), [&] { store_.put_meta(key_, std::to_string(next_)); });
  return id;
}

void IdSequence::at_least(std::uint64_t next) {
  if (next > next_) next_ = next;
}

// ---- nodes ----

NodeManager::Node& NodeManager::add(NodeRecord rec) {
  rec.id = ids_.next();
  Node& n = nodes_[rec.id];
  n.rec = std::move(rec);
  n.last_seen = std::chrono::steady_clock::now();
  save(n);
  return n;
}

NodeManager::Node& NodeManager::restore(const NodeRecord& rec) {
  ids_.at_least(rec.id + 1);
  Node& n = nodes_[rec.id];
  n.rec = rec;
  n.last_seen = std::chrono::steady_clock::now();   // its daemon has node_timeout to be heard again
  return n;
}

NodeManager::Node* NodeManager::find(std::uint64_t id) {
  auto it = nodes_.find(id);
  return it == nodes_.end() ? nullptr : &it->second;
}

void NodeManager::save(const Node& n) {
  write("a node", [&] { store_.put_node(n.rec); });
}

void NodeManager::command(std::uint64_t id, NodeCommand c) {
  if (Node* n = find(id); n != nullptr && n->rec.state == NodeState::Alive) n->commands.push_back(std::move(c));
}

// ---- workers ----

WorkerManager::Worker& WorkerManager::add(std::uint64_t node) {
  const std::uint64_t id = ids_.next();
  Worker& w = workers_[id];
  w.id = id;
  w.node = node;
  return w;
}

WorkerManager::Worker& WorkerManager::restore(std::uint64_t id, std::uint64_t node) {
  ids_.at_least(id + 1);
  Worker& w = workers_[id];
  if (w.id == 0) {
    w.id = id;
    w.node = node;
  }
  return w;
}

WorkerManager::Worker* WorkerManager::find(std::uint64_t id) {
  auto it = workers_.find(id);
  return it == workers_.end() ? nullptr : &it->second;
}

WorkerManager::Worker* WorkerManager::for_process(std::uint64_t key) {
  auto it = process_workers_.find(key);
  if (it == process_workers_.end()) return nullptr;
  Worker* w = find(it->second);
  return w != nullptr && w->state != WorkerState::Dead && !w->exiting ? w : nullptr;
}

// ---- actors ----

ActorRecord& ActorManager::add(SpawnSpec spec) {
  ActorRecord a;
  a.id = kClusterActorBase + ids_.next();
  a.spec = std::move(spec);
  auto [it, _] = actors_.emplace(a.id, std::move(a));
  return it->second;
}

ActorRecord& ActorManager::restore(ActorRecord rec) {
  if (rec.id >= kClusterActorBase) ids_.at_least(rec.id - kClusterActorBase + 1);
  auto& slot = actors_[rec.id];
  slot = std::move(rec);
  return slot;
}

ActorRecord* ActorManager::find(std::uint64_t id) {
  auto it = actors_.find(id);
  return it == actors_.end() ? nullptr : &it->second;
}

void ActorManager::save(const ActorRecord& a) {
  changed_.insert(a.id);
  write("an actor", [&] { store_.put_actor(a); });
}

// ---- placement groups ----

void GroupManager::put(const placement::GroupView& g, bool wait_if_unplaced, std::uint64_t owner) {
  const bool fresh = !groups_.contains(g.id);
  GroupRecord& r = groups_[g.id];
  if (fresh) r.owner = owner;
  r.id = g.id;
  r.name = g.name;
  r.strategy = g.strategy;
  r.bundles = g.bundles;
  r.wait_if_unplaced = wait_if_unplaced;
  r.bundle_nodes.clear();
  for (const auto& n : g.bundle_nodes) r.bundle_nodes.push_back(n.value_or(0));
  write("a placement group", [&] { store_.put_group(r); });
}

void GroupManager::remove(std::uint64_t id) {
  groups_.erase(id);
  write("a placement group's removal", [&] { store_.remove_group(id); });
}

const GroupRecord* GroupManager::find(std::uint64_t id) const {
  auto it = groups_.find(id);
  return it == groups_.end() ? nullptr : &it->second;
}

// ---- jobs ----

JobRecord& JobManager::add(JobSpec spec) {
  JobRecord j;
  j.id = ids_.next();
  j.spec = std::move(spec);
  auto [it, _] = jobs_.emplace(j.id, std::move(j));
  return it->second;
}

JobRecord& JobManager::restore(JobRecord rec) {
  ids_.at_least(rec.id + 1);
  auto& slot = jobs_[rec.id];
  slot = std::move(rec);
  return slot;
}

JobRecord* JobManager::find(std::uint64_t id) {
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : &it->second;
}

JobRecord* JobManager::find_submission(const std::string& submission_id) {
  if (submission_id.empty()) return nullptr;
  for (auto& [id, j] : jobs_) {
    if (j.spec.submission_id == submission_id) return &j;
  }
  return nullptr;
}

void JobManager::save(const JobRecord& j) {
  write("a job", [&] { store_.put_job(j); });
}

void JobManager::remove(std::uint64_t id) {
  jobs_.erase(id);
  write("a job's removal", [&] { store_.remove_job(id); });
}

}  // namespace troupe::control
