#include "head_state.hpp"

#include "troupe/ids.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>

namespace troupe::control {
namespace {

std::int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string group_name(std::uint64_t id) { return "placement group " + std::to_string(id); }

// A job's driver holds its resources in the scheduler under an id no actor has.
constexpr std::uint64_t kJobSchedulingBase = std::uint64_t(1) << 62;
std::uint64_t driver_slot(std::uint64_t job) { return kJobSchedulingBase + job; }
bool is_driver_slot(std::uint64_t id) { return id >= kJobSchedulingBase; }

std::vector<int> gpu_indices(const placement::Placement& p) {
  std::vector<int> out;
  for (const auto& g : p.gpus) out.push_back(g.index);
  return out;
}

}  // namespace

HeadState::HeadState(Store& store)
    : nodes_(store), workers_(store), actors_(store), groups_(store), jobs_(store), owners_(store, "next_owner") {
  load(store);
}

// ---- loading ------------------------------------------------------------------------------------

void HeadState::load(Store& store) {
  for (const NodeRecord& rec : store.nodes()) {
    NodeManager::Node& n = nodes_.restore(rec);
    if (rec.state != NodeState::Alive) continue;
    if (auto st = scheduler_.add_node(rec.id, rec.total); !st.ok()) {
      spdlog::error("head: node {} from the store cannot rejoin the scheduler: {}", rec.id, st.error().to_string());
      n.rec.state = NodeState::Dead;
      nodes_.save(n);
    }
  }
  for (const GroupRecord& rec : store.groups()) {
    placement::PlacementGroupSpec spec;
    spec.bundles = rec.bundles;
    spec.strategy = rec.strategy;
    spec.wait_if_unplaced = rec.wait_if_unplaced;
    spec.name = rec.name;
    std::vector<std::optional<placement::NodeId>> where;
    for (auto node : rec.bundle_nodes) where.push_back(node == 0 ? std::nullopt : std::optional(node));
    auto restored = scheduler_.restore_placement_group(rec.id, std::move(spec), where);
    if (!restored.ok()) {   // its row stays in the store as it was
      spdlog::error("head: {} from the store cannot be restored: {}", group_name(rec.id), restored.error().to_string());
      continue;
    }
    groups_.restore(rec);
    save_group(rec.id);
  }
  for (const ActorRecord& rec : store.actors()) restore_actor(actors_.restore(rec));
  for (JobRecord rec : store.jobs()) {
    JobRecord& j = jobs_.restore(std::move(rec));
    if (ended(j.state) || j.node == 0) continue;   // ended, or waiting to start: scheduled below
    // Its driver was started by a head before this one; drivers do not rejoin a new head yet.
    j.state = JobState::Failed;
    j.message = "the head restarted while its driver ran (drivers do not rejoin a restarted head yet)";
    j.ended_ms = now_ms();
    jobs_.save(j);
  }
  after_release();
  spdlog::info("head: loaded {} nodes, {} placement groups, {} actors and {} jobs from the store", nodes_.all().size(),
               groups_.all().size(), actors_.all().size(), jobs_.all().size());
}

void HeadState::restore_actor(ActorRecord& a) {
  if (a.state == ActorState::Dead || a.worker == 0) return;   // dead, or waiting for room (after_release)
  std::optional<std::uint64_t> process;
  if (a.reserved) {
    placement::ActorRequest req{a.id, a.spec.resources, {}, false, {}, a.node};
    if (a.spec.placement_group != 0) {
      req.bundle = placement::BundleRef{a.spec.placement_group, a.bundle};
      req.colocate = a.spec.colocate;
    }
    auto placed = scheduler_.place_actor(req);
    if (!placed.ok()) {   // the room it had is gone: it is started again like one that lost its process
      spdlog::warn("head: actor {} cannot be put back on node {}: {}", a.id, a.node, placed.error().to_string());
      a.reserved = false;
      a.worker = a.node = 0;
      a.bundle = -1;
      if (a.state != ActorState::Pending) a.state = ActorState::Restarting;
      a.reason = "its recorded placement could not be restored: " + placed.error().message;
      actors_.save(a);
      return;
    }
    process = placed->worker.process;
  }
  Worker& w = workers_.restore(a.worker, a.node);
  if (process) workers_.bind_process(*process, w.id);
  w.actors.insert(a.id);
  if (a.state == ActorState::Alive) {
    w.state = WorkerState::Alive;
    w.gateway = a.gateway;
    w.pid = a.pid;
  }
}

// ---- nodes --------------------------------------------------------------------------------------

Result<std::uint64_t> HeadState::register_node(NodeRecord rec) {
  rec.state = NodeState::Alive;
  rec.registered_ms = rec.last_seen_ms = now_ms();
  // The scheduler checks the resources first: a refused node takes no id and leaves no record.
  if (auto st = scheduler_.add_node(nodes_.next_id(), rec.total); !st.ok()) {
    return Error{ControlCode::BadRequest, st.error().message};
  }
  NodeManager::Node& n = nodes_.add(std::move(rec));
  spdlog::info("head: node {} joined from {} with {}", n.rec.id, n.rec.address, n.rec.total.to_string());
  after_release();
  return n.rec.id;
}

Result<NodeState> HeadState::node_seen(std::uint64_t id) {
  NodeManager::Node* n = nodes_.find(id);
  if (n == nullptr) return Error{ControlCode::NotFound, "unknown node " + std::to_string(id)};
  if (n->rec.state == NodeState::Alive) n->last_seen = std::chrono::steady_clock::now();
  return n->rec.state;
}

std::vector<NodeCommand> HeadState::take_node_commands(std::uint64_t id) {
  NodeManager::Node* n = nodes_.find(id);
  if (n == nullptr) return {};
  std::vector<NodeCommand> out(std::make_move_iterator(n->commands.begin()), std::make_move_iterator(n->commands.end()));
  n->commands.clear();
  return out;
}

Status HeadState::worker_exited(std::uint64_t node, std::uint64_t worker, const std::string& how) {
  if (nodes_.find(node) == nullptr) return Error{ControlCode::NotFound, "unknown node " + std::to_string(node)};
  Worker* w = workers_.find(worker);
  if (w != nullptr && w->node == node) on_worker_lost(*w, "its worker process exited (" + how + ")");
  return {};
}

Status HeadState::node_gone(std::uint64_t id, const std::string& why) {
  NodeManager::Node* n = nodes_.find(id);
  if (n == nullptr) return Error{ControlCode::NotFound, "unknown node " + std::to_string(id)};
  if (n->rec.state == NodeState::Alive) node_dead(*n, why);
  return {};
}

bool HeadState::expire_nodes(std::chrono::milliseconds timeout) {
  const auto now = std::chrono::steady_clock::now();
  bool any = false;
  for (auto& [id, n] : nodes_.all()) {
    if (n.rec.state == NodeState::Alive && now - n.last_seen > timeout) {
      node_dead(n, "missed heartbeats for " + std::to_string(timeout.count()) + " ms");
      any = true;
    }
  }
  return any;
}

void HeadState::node_dead(NodeManager::Node& n, const std::string& why) {
  const std::uint64_t id = n.rec.id;
  n.rec.state = NodeState::Dead;
  n.rec.last_seen_ms = now_ms();
  n.commands.clear();
  nodes_.save(n);
  spdlog::warn("head: node {} is dead: {}", id, why);
  const bool drained = n.rec.drain == NodeDrain::Drained;   // the scheduler let it go then
  auto loss = drained ? Result<placement::NodeLoss>(placement::NodeLoss{}) : scheduler_.mark_dead(id);
  if (!loss.ok()) {
    spdlog::error("head: the scheduler could not retire node {}: {}", id, loss.error().to_string());
  } else {
    for (auto aid : loss->lost_actors) {   // the scheduler has let them go: nothing to release
      if (is_driver_slot(aid)) {
        if (JobRecord* j = jobs_.find(aid - kJobSchedulingBase)) j->placed = false;
      } else if (ActorRecord* a = actors_.find(aid)) {
        a->reserved = false;
      }
    }
    for (auto gid : loss->re_reserved) {
      spdlog::info("head: {} lost bundles on node {}; reserved again elsewhere", group_name(gid), id);
      save_group(gid);
    }
    for (auto gid : loss->rescheduling) {
      spdlog::warn("head: {} lost bundles on node {}; waiting for room", group_name(gid), id);
      save_group(gid);
    }
  }
  for (auto& [wid, w] : workers_.all()) {
    if (w.node == id) on_worker_lost(w, "its node " + std::to_string(id) + " died (" + why + ")");
  }
  for (auto& [jid, j] : jobs_.all()) {
    if (j.launched && j.node == id && !ended(j.state)) {
      attempt_ended(j, std::nullopt, std::nullopt, "its driver's node " + std::to_string(id) + " died (" + why + ")");
    }
  }
}

Result<const NodeRecord*> HeadState::drain_node(std::uint64_t id, std::chrono::milliseconds deadline) {
  NodeManager::Node* n = nodes_.find(id);
  if (n == nullptr) return Error{ControlCode::NotFound, "unknown node " + std::to_string(id)};
  if (n->rec.state != NodeState::Alive) return Error{ControlCode::Conflict, "node " + std::to_string(id) + " is dead"};
  if (n->rec.drain != NodeDrain::None) return &n->rec;
  if (auto st = scheduler_.drain_node(id); !st.ok()) {
    return Error{ControlCode::Conflict, "node " + std::to_string(id) + ": " + st.error().message};
  }
  const auto now = std::chrono::steady_clock::now();
  n->rec.drain = NodeDrain::Draining;
  n->drain_deadline = now + deadline;
  spdlog::info("head: draining node {} (deadline {} ms)", id, deadline.count());
  for (auto& [aid, a] : actors_.all()) {   // elastic members leave their epochs now
    if (a.node != id || a.state == ActorState::Dead || !elastic_.contains(a.spec.elastic_group)) continue;
    a.leaving = true;
    Worker* w = workers_.find(a.worker);
    if (a.state == ActorState::Alive && w != nullptr && w->state != WorkerState::Dead) {
      w->commands.push_back(WorkerCommand::drain(a.id, a.incarnation));   // it says when its queue is done
      actors_.save(a);
    } else {
      bury(a, "its node " + std::to_string(id) + " was drained");   // not running yet: nothing to finish
    }
  }
  // A worker whose actors can all restart elsewhere moves now. Not one in a placement group: its
  // bundle is reserved here until the node goes, and a restart would land here again (each new
  // worker moved in turn, for ever with unlimited restarts). Listed before any moves: a restart
  // starts a new worker.
  std::vector<std::uint64_t> moving;
  for (auto& [wid, w] : workers_.all()) {
    if (w.node != id || w.state == WorkerState::Dead || w.actors.empty()) continue;
    const bool movable = std::all_of(w.actors.begin(), w.actors.end(), [&](std::uint64_t aid) {
      const ActorRecord* a = actors_.find(aid);
      return a != nullptr && !a->leaving && a->bundle < 0 && (a->spec.max_restarts < 0 || a->restarts < a->spec.max_restarts);
    });
    if (movable) moving.push_back(wid);
  }
  for (auto wid : moving) {
    if (Worker* w = workers_.find(wid); w != nullptr && w->state != WorkerState::Dead) {
      on_worker_lost(*w, "its node " + std::to_string(id) + " is draining");
    }
  }
  advance_drains(now);
  return &n->rec;
}

bool HeadState::advance_drains(SteadyTime now) {
  bool any = false;
  for (auto& [id, n] : nodes_.all()) {
    if (n.rec.drain != NodeDrain::Draining || n.rec.state != NodeState::Alive) continue;
    std::vector<ActorRecord*> left;
    for (auto& [aid, a] : actors_.all()) {
      if (a.node != id || a.state == ActorState::Dead) continue;
      left.push_back(&a);   // a leaving member goes when its worker reports it drained
    }
    if (!left.empty() && now < n.drain_deadline) continue;
    for (ActorRecord* a : left) {   // could not move by the deadline: stopped, and listed
      n.rec.drain_left.push_back(actor_label(a->spec.name.empty() ? a->spec.type : a->spec.name, a->id) + ": " +
                                 (a->leaving ? "an elastic member" : a->bundle >= 0 ? "in a placement group's bundle" : "no restarts left"));
      bury(*a, "its node " + std::to_string(id) + " was drained before it could move");
    }
    for (auto& [wid, w] : workers_.all()) {
      if (w.node == id && w.state != WorkerState::Dead) on_worker_lost(w, "its node " + std::to_string(id) + " was drained");
    }
    auto loss = scheduler_.mark_dead(id);   // nothing runs there now; its bundles are reserved elsewhere
    if (loss.ok()) {
      for (auto gid : loss->re_reserved) save_group(gid);
      for (auto gid : loss->rescheduling) save_group(gid);
    }
    n.rec.drain = NodeDrain::Drained;
    spdlog::info("head: node {} is drained ({} actors could not move)", id, n.rec.drain_left.size());
    any = true;
  }
  if (any) after_release();
  return any;
}

std::optional<SteadyTime> HeadState::next_drain_time() {
  std::optional<SteadyTime> next;
  const auto now = std::chrono::steady_clock::now();
  for (auto& [id, n] : nodes_.all()) {
    if (n.rec.drain != NodeDrain::Draining) continue;
    if (n.drain_deadline > now && (!next || n.drain_deadline < *next)) next = n.drain_deadline;
  }
  return next;
}

// ---- workers ------------------------------------------------------------------------------------

Result<WorkerState> HeadState::worker_ready(std::uint64_t id, std::string gateway, std::int64_t pid) {
  Worker* w = workers_.find(id);
  if (w == nullptr || w->state == WorkerState::Dead) return WorkerState::Dead;
  w->state = WorkerState::Alive;
  w->gateway = std::move(gateway);
  w->pid = pid;
  spdlog::info("head: worker {} on node {} is up at {} (pid {})", id, w->node, w->gateway, w->pid);
  return w->state;
}

Result<WorkerState> HeadState::worker_state(std::uint64_t id) {
  Worker* w = workers_.find(id);
  if (w == nullptr) return Error{ControlCode::NotFound, "unknown worker " + std::to_string(id)};
  return w->state;
}

std::vector<WorkerCommand> HeadState::take_worker_commands(std::uint64_t id) {
  Worker* w = workers_.find(id);
  if (w == nullptr) return {};
  std::vector<WorkerCommand> out(std::make_move_iterator(w->commands.begin()), std::make_move_iterator(w->commands.end()));
  w->commands.clear();
  return out;
}

Status HeadState::actor_events(std::uint64_t worker, const std::vector<ActorEvent>& events) {
  Worker* w = workers_.find(worker);
  if (w == nullptr) return Error{ControlCode::NotFound, "unknown worker " + std::to_string(worker)};
  for (const ActorEvent& e : events) {
    ActorRecord* a = actors_.find(e.actor);
    if (a == nullptr || a->worker != worker) continue;
    if (e.incarnation != a->incarnation || a->state == ActorState::Dead) continue;   // stale (FT-2)
    if (e.kind == ActorEvent::Kind::Drained) {
      if (a->leaving) bury(*a, "its node " + std::to_string(a->node) + " was drained (its calls finished first)");
      continue;
    }
    if (e.kind == ActorEvent::Kind::Ready) {
      a->state = ActorState::Alive;
      a->gateway = w->gateway;
      a->pid = w->pid;
      a->reason.clear();
    } else {
      a->state = ActorState::Dead;
      a->reason = "its constructor failed: " + (e.reason.empty() ? std::string("unknown") : e.reason);
      release(*a);
      w->actors.erase(a->id);
      if (w->actors.empty()) retire(*w);
    }
    actors_.save(*a);
  }
  advance_drains(std::chrono::steady_clock::now());   // a drained member may have been the last
  after_release();
  return {};
}

void HeadState::on_worker_lost(Worker& w, const std::string& why) {
  if (w.state == WorkerState::Dead) return;
  w.state = WorkerState::Dead;
  w.commands.clear();
  NodeCommand kill;
  kill.kind = NodeCommand::Kind::KillWorker;
  kill.worker = w.id;
  nodes_.command(w.node, std::move(kill));
  if (w.actors.empty()) spdlog::info("head: worker {} on node {} ended: {}", w.id, w.node, why);
  else spdlog::warn("head: worker {} on node {} lost: {}", w.id, w.node, why);
  // Colocated actors restart together: those the scheduler places first (a bundle's colocated
  // actors share its worker key), then those that only shared this process (colocate_with).
  std::vector<ActorRecord*> members;
  for (auto aid : w.actors) {
    if (ActorRecord* a = actors_.find(aid)) members.push_back(a);
  }
  w.actors.clear();
  std::stable_partition(members.begin(), members.end(), [](const ActorRecord* a) { return a->reserved; });
  std::map<std::uint64_t, Worker*> regroup;
  for (ActorRecord* a : members) restart_or_bury(*a, why, regroup);
  after_release();
}

// ---- actors -------------------------------------------------------------------------------------

Result<const ActorRecord*> HeadState::create_actor(SpawnSpec spec) {
  Worker* host = nullptr;
  if (spec.colocate_with != 0) {
    const ActorRecord* target = actors_.find(spec.colocate_with);
    host = target != nullptr && target->state != ActorState::Dead ? workers_.find(target->worker) : nullptr;
    if (host == nullptr || host->state == WorkerState::Dead) {
      const bool hosted = target != nullptr && target->state != ActorState::Dead && target->worker == 0;
      return Error{ControlCode::Conflict, "cannot colocate with actor " + std::to_string(spec.colocate_with) +
                                              (hosted ? ": it runs in its driver's process" : ": it is not running")};
    }
  }
  ActorRecord& a = actors_.add(std::move(spec));
  if (host != nullptr) start_on_worker(*host, a);   // shares that process and its resources
  else place_and_start(a);
  actors_.save(a);
  return &a;
}

const ActorRecord* HeadState::host_actor(SpawnSpec spec, std::string gateway, std::int64_t pid) {
  spec.max_restarts = 0;
  ActorRecord& a = actors_.add(std::move(spec));
  a.state = ActorState::Alive;
  a.gateway = std::move(gateway);
  a.pid = pid;
  a.incarnation = 1;
  actors_.save(a);
  return &a;
}

Result<const ActorRecord*> HeadState::kill_actor(std::uint64_t id, const std::string& reason) {
  ActorRecord* a = actors_.find(id);
  if (a == nullptr) return Error{ControlCode::NotFound, "unknown actor " + std::to_string(id)};
  if (a->state != ActorState::Dead) {
    bury(*a, reason);
    after_release();
  }
  return a;
}

const ActorRecord* HeadState::actor(std::uint64_t id) { return actors_.find(id); }

void HeadState::place_and_start(ActorRecord& a) {
  placement::ActorRequest req{a.id, a.spec.resources, {}, false, {}, std::nullopt};
  if (a.spec.placement_group != 0) {
    req.bundle = placement::BundleRef{a.spec.placement_group, a.spec.bundle_index};
    req.colocate = a.spec.colocate;
  }
  auto placed = scheduler_.place_actor(req);
  if (!placed.ok()) {
    a.worker = a.node = 0;
    a.bundle = -1;
    if (placed.error().code == PlacementCode::InvalidArgument || placed.error().code == PlacementCode::NotFound) {
      a.state = ActorState::Dead;   // can never be placed: a bad bundle index, a removed group
      a.reason = "cannot be placed: " + placed.error().message;
      return;
    }
    std::string reason = "waiting for resources: " + placed.error().message;   // until a node or a bundle has room
    if (reason != a.reason) spdlog::info("head: actor {} is pending: {}", a.id, placed.error().to_string());
    a.reason = std::move(reason);
    return;
  }
  a.reserved = true;
  a.bundle = placed->bundle ? placed->bundle->index : -1;
  start_on_worker(worker_for(*placed, a.spec), a);
}

WorkerManager::Worker& HeadState::worker_for(const placement::Placement& p, const SpawnSpec& spec) {
  if (Worker* w = workers_.for_process(p.worker.process)) return *w;
  Worker& w = workers_.add(p.node);
  NodeCommand start;   // Kind::StartWorker
  start.worker = w.id;
  start.binary = spec.binary;
  start.job = spec.job;
  if (const JobRecord* j = jobs_.find(spec.job)) start.package = j->spec.package;
  start.gpus = gpu_indices(p);
  nodes_.command(p.node, std::move(start));
  workers_.bind_process(p.worker.process, w.id);
  return w;
}

void HeadState::start_on_worker(Worker& w, ActorRecord& a) {
  a.worker = w.id;
  a.node = w.node;
  a.gateway.clear();
  a.reason.clear();
  a.incarnation += 1;
  w.actors.insert(a.id);
  w.commands.push_back(WorkerCommand::spawn(a));
}

void HeadState::release(ActorRecord& a) {
  if (!a.reserved) return;
  a.reserved = false;
  if (auto st = scheduler_.release_actor(a.id); !st.ok()) {
    spdlog::error("head: the scheduler did not hold actor {}: {}", a.id, st.error().to_string());
  }
}

// A worker whose last actor went is told to exit, and takes no new actor (a colocated one would be
// spawned into a process that is exiting).
void HeadState::retire(Worker& w) {
  w.commands.push_back(WorkerCommand::exit());
  w.exiting = true;
}

void HeadState::bury(ActorRecord& a, const std::string& why) {
  a.state = ActorState::Dead;
  a.reason = why;
  release(a);
  if (Worker* w = workers_.find(a.worker)) {
    w->actors.erase(a.id);
    w->commands.push_back(WorkerCommand::kill(a.id));
    if (w->actors.empty()) retire(*w);
  }
  actors_.save(a);
}

void HeadState::restart_or_bury(ActorRecord& a, const std::string& why, std::map<std::uint64_t, Worker*>& regroup) {
  if (a.state == ActorState::Dead) return;
  const bool shared_process = !a.reserved;   // colocate_with: it goes where its hosts went
  release(a);
  const std::uint64_t old_worker = a.worker;
  if (a.spec.max_restarts >= 0 && a.restarts >= a.spec.max_restarts) {
    a.state = ActorState::Dead;
    a.reason = why + "; no restarts left (" + std::to_string(a.restarts) + " of " +
               std::to_string(a.spec.max_restarts) + " used)";
    actors_.save(a);
    return;
  }
  if (a.leaving) {   // an elastic member leaving a draining node (which died first): its group replaces it
    a.state = ActorState::Dead;
    a.reason = why + "; it was leaving a draining node";
    actors_.save(a);
    return;
  }
  a.restarts += 1;
  a.state = ActorState::Restarting;
  if (auto it = regroup.find(old_worker); shared_process && it != regroup.end()) {
    start_on_worker(*it->second, a);
  } else {
    place_and_start(a);
    if (Worker* w = workers_.find(a.worker); w != nullptr && !regroup.contains(old_worker)) regroup[old_worker] = w;
  }
  spdlog::info("head: restarting actor {} ({}), restart {}", a.id, why, a.restarts);
  actors_.save(a);
}

void HeadState::after_release() {
  for (int round = 0; round < 4; ++round) {   // stopping members past a target frees room: again, a few times at most
    for (auto gid : scheduler_.take_ready_groups()) {
      spdlog::info("head: {} is reserved", group_name(gid));
      save_group(gid);   // its actors waiting for it are placed below
    }
    place_pending();
    schedule_jobs();
    if (!reconcile_elastic()) return;
  }
  place_pending();   // members the last round created wait for room like the others
}

void HeadState::place_pending() {
  auto waiting = [](const ActorRecord& a) {
    return (a.state == ActorState::Pending || a.state == ActorState::Restarting) && a.worker == 0;
  };
  for (auto& [aid, a] : actors_.all()) {
    if (waiting(a) && (a.spec.elastic_group == 0 || !elastic_.contains(a.spec.elastic_group))) {
      place_and_start(a);
      actors_.save(a);
    }
  }
  // Elastic members: one at a time to the group furthest below its target (the deficit rule).
  std::vector<placement::ElasticDemand> demands;
  for (auto& [gid, g] : elastic_) demands.push_back(demand(g));
  placement::elastic_fill(demands, [&](const placement::ElasticDemand& d) {
    for (auto mid : elastic_.at(d.group).members) {   // its oldest waiting member
      ActorRecord* a = actors_.find(mid);
      if (a == nullptr || !waiting(*a)) continue;
      place_and_start(*a);
      actors_.save(*a);
      return a->worker != 0;   // no room for one: none of its members fits (they are alike)
    }
    return false;
  });
}

placement::ElasticDemand HeadState::demand(const ElasticGroupRecord& g) {
  placement::ElasticDemand d{g.id, g.target, 0, 0};
  for (auto mid : g.members) {
    const ActorRecord* a = actors_.find(mid);
    if (a == nullptr || a->state == ActorState::Dead) continue;
    if (a->worker != 0) ++d.live;   // running, or placed and starting: it has its room
    else ++d.starting;
  }
  return d;
}

std::int64_t HeadState::elastic_live(const ElasticGroupRecord& g) {
  std::int64_t n = 0;
  for (auto mid : g.members) {
    const ActorRecord* a = actors_.find(mid);
    n += a != nullptr && a->state == ActorState::Alive ? 1 : 0;
  }
  return n;
}

std::string HeadState::elastic_reason(const ElasticGroupRecord& g) {
  if (elastic_live(g) >= g.target) return "";
  for (auto mid : g.members) {
    const ActorRecord* a = actors_.find(mid);
    if (a != nullptr && a->state != ActorState::Alive && a->state != ActorState::Dead && !a->reason.empty()) return a->reason;
  }
  return "members are starting";
}

bool HeadState::reconcile_elastic() {
  bool any = false;
  for (auto& [gid, g] : elastic_) {
    std::erase_if(g.members, [&](std::uint64_t mid) {
      const ActorRecord* a = actors_.find(mid);
      return a == nullptr || a->state == ActorState::Dead;   // a departed member: replaced below
    });
    const auto d = demand(g);
    auto delta = placement::elastic_delta(d);
    for (; delta > 0; --delta) {   // placed by place_pending, with the other groups' by deficit
      ActorRecord& a = actors_.add(g.member);
      g.members.push_back(a.id);
      a.reason = "waiting for room (elastic group " + g.name + ")";
      actors_.save(a);
      any = true;
    }
    // Past the target: the newest waiting members first, then the newest running ones.
    for (int pass = 0; pass < 2 && delta < 0; ++pass) {
      for (auto it = g.members.rbegin(); it != g.members.rend() && delta < 0; ++it) {
        ActorRecord* a = actors_.find(*it);
        if (a == nullptr || a->state == ActorState::Dead || (pass == 0) == (a->state == ActorState::Alive)) continue;
        bury(*a, "its elastic group " + g.name + " shrank to " + std::to_string(g.target));
        ++delta;
        any = true;
      }
    }
  }
  return any;
}

Result<const ElasticGroupRecord*> HeadState::create_elastic(ElasticGroupRecord g) {
  if (g.min < 0 || g.max < std::max<std::int64_t>(1, g.min) || g.max > 1000) {
    return Error{ControlCode::BadRequest, "an elastic group needs 0 <= min <= max, 1 <= max <= 1000 (got min " + std::to_string(g.min) +
                                              ", max " + std::to_string(g.max) + ")"};
  }
  g.id = next_elastic_++;
  g.target = g.max;
  g.member.elastic_group = g.id;
  g.member.owner = g.owner;
  g.member.job = g.job;
  g.members.clear();
  auto [it, _] = elastic_.emplace(g.id, std::move(g));
  spdlog::info("head: elastic group {} ({}): {} to {} members", it->second.id, it->second.name, it->second.min, it->second.max);
  after_release();   // starts its members
  return &it->second;
}

Result<const ElasticGroupRecord*> HeadState::scale_elastic(std::uint64_t id, std::optional<std::int64_t> target,
                                                           std::optional<std::int64_t> min, std::optional<std::int64_t> max) {
  auto it = elastic_.find(id);
  if (it == elastic_.end()) return Error{ControlCode::NotFound, "unknown elastic group " + std::to_string(id)};
  ElasticGroupRecord& g = it->second;
  const std::int64_t new_min = min.value_or(g.min), new_max = max.value_or(g.max);
  if (new_min < 0 || new_max < std::max<std::int64_t>(1, new_min) || new_max > 1000) {
    return Error{ControlCode::BadRequest, "bounds must be 0 <= min <= max, 1 <= max <= 1000 (got min " + std::to_string(new_min) +
                                              ", max " + std::to_string(new_max) + ")"};
  }
  if (target && (*target < new_min || *target > new_max)) {
    return Error{ControlCode::BadRequest, "replicas " + std::to_string(*target) + " is out of [" + std::to_string(new_min) +
                                              ", " + std::to_string(new_max) + "]"};
  }
  g.min = new_min;
  g.max = new_max;
  g.target = target.value_or(std::clamp(g.target, new_min, new_max));
  spdlog::info("head: elastic group {} ({}): target {} in [{}, {}]", g.id, g.name, g.target, g.min, g.max);
  after_release();
  return &g;
}

Result<std::size_t> HeadState::remove_elastic(std::uint64_t id) {
  auto it = elastic_.find(id);
  if (it == elastic_.end()) return Error{ControlCode::NotFound, "unknown elastic group " + std::to_string(id)};
  const std::string name = it->second.name;
  elastic_.erase(it);   // first, so that no member is replaced
  std::size_t stopped = 0;
  for (auto& [aid, a] : actors_.all()) {
    if (a.spec.elastic_group != id || a.state == ActorState::Dead) continue;
    bury(a, "its elastic group " + name + " was removed");
    ++stopped;
  }
  after_release();
  spdlog::info("head: elastic group {} ({}) removed, {} members stopped", id, name, stopped);
  return stopped;
}

// ---- placement groups ---------------------------------------------------------------------------

Result<placement::CreateResult> HeadState::create_group(placement::PlacementGroupSpec spec, std::uint64_t owner) {
  const bool wait = spec.wait_if_unplaced;
  const auto strategy = spec.strategy;
  const auto bundles = spec.bundles.size();
  auto created = scheduler_.create_placement_group(std::move(spec));
  if (!created.ok()) {
    const bool bad = created.error().code == PlacementCode::InvalidArgument;
    return Error{bad ? ControlCode::BadRequest : ControlCode::Conflict, created.error().to_string()};
  }
  if (auto g = scheduler_.group(created->id)) groups_.put(*g, wait, owner);
  spdlog::info("head: {} ({}, {} bundles): {}", group_name(created->id), placement::to_string(strategy), bundles,
               placement::to_string(created->state));
  return created;
}

Result<std::vector<placement::ActorId>> HeadState::remove_group(std::uint64_t id) {
  auto removed = scheduler_.remove_placement_group(id);
  if (!removed.ok()) return Error{ControlCode::NotFound, removed.error().to_string()};
  for (auto aid : *removed) {
    ActorRecord* a = actors_.find(aid);
    if (a == nullptr) continue;
    a->reserved = false;   // released with the group
    if (a->state != ActorState::Dead) bury(*a, "its placement group was removed");
  }
  groups_.remove(id);
  after_release();
  return removed;
}

std::pair<std::size_t, std::size_t> HeadState::owner_gone(std::uint64_t owner, const std::string& why) {
  if (owner == 0) return {0, 0};
  std::size_t actors = 0, groups = 0;
  std::erase_if(elastic_, [&](const auto& e) { return e.second.owner == owner; });   // no member is replaced now
  for (auto& [id, a] : actors_.all()) {
    if (a.spec.owner != owner || a.state == ActorState::Dead) continue;
    bury(a, why);
    ++actors;
  }
  std::vector<std::uint64_t> owned;
  for (const auto& [id, g] : groups_.all()) {
    if (g.owner == owner) owned.push_back(id);
  }
  for (auto id : owned) {
    if (remove_group(id).ok()) ++groups;
  }
  after_release();
  if (actors + groups > 0) spdlog::info("head: {}: {} actors killed, {} placement groups removed", why, actors, groups);
  return {actors, groups};
}

// ---- jobs ---------------------------------------------------------------------------------------

Result<std::pair<const JobRecord*, bool>> HeadState::submit_job(JobSpec spec) {
  if (JobRecord* known = jobs_.find_submission(spec.submission_id)) {
    if (known->spec.to_json() != spec.to_json()) {
      return Error{ControlCode::Conflict, "submission id '" + spec.submission_id + "' is job " +
                                              std::to_string(known->id) + ", submitted with another spec"};
    }
    return std::pair<const JobRecord*, bool>{known, false};
  }
  JobRecord& j = jobs_.add(std::move(spec));
  j.submitted_ms = now_ms();
  j.owner = owners_.next();
  j.message = "waiting to be scheduled";
  spdlog::info("head: job {} submitted: {}", j.id, j.spec.entrypoint[0]);
  schedule_jobs();
  jobs_.save(j);
  return std::pair<const JobRecord*, bool>{&j, true};
}

void HeadState::schedule_jobs() {
  for (auto& [jid, j] : jobs_.all()) {
    if (j.state != JobState::Pending || j.launched || j.stop_requested) continue;
    placement::ActorRequest req{driver_slot(j.id), j.spec.resources, {}, false, {}, std::nullopt};
    auto placed = scheduler_.place_actor(req);
    if (!placed.ok()) {
      std::string reason = "waiting for a node with " + j.spec.resources.to_string() + " free: " + placed.error().message;
      if (reason != j.message) {
        j.message = std::move(reason);
        jobs_.save(j);
      }
      continue;
    }
    j.placed = j.launched = true;
    j.node = placed->node;
    j.attempts += 1;
    j.driver_pid = 0;
    j.message = "starting its driver on node " + std::to_string(j.node) + " (attempt " + std::to_string(j.attempts) +
                " of " + std::to_string(j.spec.max_attempts) +
                (j.last_failure.empty() ? std::string(")") : "; attempt " + std::to_string(j.attempts - 1) + " failed: " + j.last_failure + ")");
    NodeCommand start;
    start.kind = NodeCommand::Kind::StartDriver;
    start.job = j.id;
    start.attempt = j.attempts;
    start.package = j.spec.package;
    start.entrypoint = j.spec.entrypoint;
    start.env = j.spec.env;
    start.gpus = gpu_indices(*placed);
    nodes_.command(j.node, std::move(start));
    spdlog::info("head: job {}: {}", j.id, j.message);
    jobs_.save(j);
  }
}

Result<const JobRecord*> HeadState::stop_job(std::uint64_t id, std::int64_t grace_ms) {
  JobRecord* j = jobs_.find(id);
  if (j == nullptr) return Error{ControlCode::NotFound, "unknown job " + std::to_string(id)};
  if (ended(j->state)) return j;
  j->stop_requested = true;
  if (!j->launched) {   // never ran (or between attempts): stopped now
    attempt_ended(*j, std::nullopt, std::nullopt, "stopped before it ran");
    return j;
  }
  NodeCommand stop;
  stop.kind = NodeCommand::Kind::StopDriver;
  stop.job = j->id;
  stop.attempt = j->attempts;
  stop.grace_ms = grace_ms;
  nodes_.command(j->node, std::move(stop));
  j->message = "stopping (SIGTERM, then SIGKILL after " + std::to_string(grace_ms) + " ms)";
  jobs_.save(*j);
  return j;
}

Status HeadState::delete_job(std::uint64_t id) {
  JobRecord* j = jobs_.find(id);
  if (j == nullptr) return Error{ControlCode::NotFound, "unknown job " + std::to_string(id)};
  if (!ended(j->state)) {
    return Error{ControlCode::Conflict, "job " + std::to_string(id) + " is " + std::string(to_string(j->state)) +
                                            ": stop it first"};
  }
  jobs_.remove(id);
  return {};
}

JobRecord* HeadState::launched_job(std::uint64_t node, std::uint64_t job, std::int64_t attempt) {
  JobRecord* j = jobs_.find(job);
  if (j == nullptr || !j->launched || j->attempts != attempt || (node != 0 && j->node != node) || ended(j->state)) {
    return nullptr;   // another attempt's, or stale
  }
  return j;
}

Result<std::uint64_t> HeadState::driver_connected(std::uint64_t job, std::int64_t attempt, std::int64_t pid) {
  JobRecord* j = launched_job(0, job, attempt);
  if (j == nullptr) {
    return Error{ControlCode::Conflict, "job " + std::to_string(job) + " attempt " + std::to_string(attempt) +
                                            " is not starting"};
  }
  if (j->state == JobState::Pending) {
    j->state = JobState::Running;
    if (j->started_ms == 0) j->started_ms = now_ms();
    if (!j->stop_requested) j->message.clear();
    spdlog::info("head: job {} is running (attempt {}, pid {})", j->id, attempt, pid);
  }
  if (pid != 0) j->driver_pid = pid;
  jobs_.save(*j);
  return j->owner;
}

void HeadState::driver_started(std::uint64_t node, std::uint64_t job, std::int64_t attempt, std::int64_t pid) {
  JobRecord* j = launched_job(node, job, attempt);
  if (j == nullptr) return;
  j->driver_pid = pid;
  if (j->state == JobState::Pending && !j->stop_requested) {
    j->message = "its driver started on node " + std::to_string(node) + " (pid " + std::to_string(pid) +
                 "); waiting for its runtime to connect";
  }
  jobs_.save(*j);
}

void HeadState::driver_progress(std::uint64_t node, std::uint64_t job, std::int64_t attempt, const std::string& message) {
  JobRecord* j = launched_job(node, job, attempt);
  if (j == nullptr || j->state != JobState::Pending || j->stop_requested) return;
  j->message = message;
  jobs_.save(*j);
}

void HeadState::driver_exited(std::uint64_t node, std::uint64_t job, std::int64_t attempt, const std::string& how) {
  JobRecord* j = launched_job(node, job, attempt);
  if (j == nullptr) return;
  std::optional<int> code, sig;
  std::string why;
  try {
    if (how.rfind("exit ", 0) == 0) code = std::stoi(how.substr(5));
    else if (how.rfind("signal ", 0) == 0) sig = std::stoi(how.substr(7));
  } catch (const std::exception&) {
  }
  if (code) why = "its driver exited with " + std::to_string(*code);
  else if (sig) why = "its driver was killed by signal " + std::to_string(*sig);
  else why = "its driver could not start: " + how;
  attempt_ended(*j, code, sig, why);
}

void HeadState::attempt_ended(JobRecord& j, std::optional<int> exit_code, std::optional<int> signal, const std::string& why) {
  if (j.placed) {
    if (auto st = scheduler_.release_actor(driver_slot(j.id)); !st.ok()) {
      spdlog::error("head: the scheduler did not hold job {}'s driver: {}", j.id, st.error().to_string());
    }
    j.placed = false;
  }
  j.launched = false;
  j.exit_code = exit_code;
  j.signal = signal;
  const std::uint64_t old_owner = j.owner;
  const bool attempted = j.attempts > 0;
  if (j.stop_requested) {
    j.state = JobState::Stopped;
    j.message = "stopped" + (attempted && why != "stopped before it ran" ? " (" + why + ")" : std::string());
  } else if (exit_code && *exit_code == 0) {
    j.state = JobState::Succeeded;
    j.message = why;
  } else if (j.attempts < j.spec.max_attempts) {
    j.state = JobState::Pending;
    j.node = 0;
    j.owner = owners_.next();   // the next attempt's creations are its own
    j.last_failure = why;
    j.message = "attempt " + std::to_string(j.attempts) + " of " + std::to_string(j.spec.max_attempts) +
                " failed (" + why + "); waiting to start the next";
  } else {
    j.state = JobState::Failed;
    j.message = why;
  }
  if (ended(j.state)) {
    j.ended_ms = now_ms();
    ended_jobs_.push_back(j.id);
    spdlog::info("head: job {} {}: {}", j.id, to_string(j.state), j.message);
  } else {
    spdlog::warn("head: job {}: {}", j.id, j.message);
  }
  jobs_.save(j);
  owner_gone(old_owner, "its job " + std::to_string(j.id) + (ended(j.state) ? " ended" : "'s attempt ended"));   // JOB-1
}

void HeadState::save_group(std::uint64_t id) {
  auto g = scheduler_.group(id);
  if (!g) return;
  const GroupRecord* rec = groups_.find(id);
  groups_.put(*g, rec == nullptr || rec->wait_if_unplaced);
}

std::optional<placement::Resources> HeadState::available(std::uint64_t node) const {
  auto v = scheduler_.node(node);
  if (!v || v->state != placement::NodeState::kAlive) return std::nullopt;
  return v->available;
}

}  // namespace troupe::control
