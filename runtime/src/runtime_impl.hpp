// The process's runtime: its CAF actor system, the deadline timer, the table of actors this
// process knows (local hosts and remote cells), and its link to the cluster.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>

#include "actor_cell.hpp"
#include "actor_host.hpp"
#include "cluster/client.hpp"
#include "deadline_timer.hpp"
#include "troupe/embedded_cluster.hpp"
#include "troupe/runtime.hpp"

namespace troupe::cluster {
class Peers;
}

namespace troupe::detail {

class RuntimeImpl {
 public:
  explicit RuntimeImpl(RuntimeConfig config);
  ~RuntimeImpl();   // shutdown()

  // In this process, or (opts.needs_process()) in a worker process through the cluster.
  std::shared_ptr<ActorCell> spawn(const ActorTypeInfo& type, const std::string& signature, Factory factory,
                                   Payload ctor_args, const Options& opts);
  // Worker processes: hosts cluster actor `id` here.
  std::shared_ptr<ActorCell> spawn_hosted(std::uint64_t id, const ActorTypeInfo& type, Factory factory,
                                          Payload ctor_args, const Options& opts, HostContext ctx);
  // The route to the host of an actor of this process (null if it has none): worker processes hand
  // it to their call server.
  static std::shared_ptr<LocalRoute> host_of(const ActorCell& cell);
  // The process's live runtime, or null (tests and benchmarks look inside it).
  static RuntimeImpl* current();
  cluster::Peers* peers_if_any();
  void kill(const std::shared_ptr<ActorCell>& cell);
  std::shared_ptr<ActorCell> find(std::uint64_t id) const;
  std::shared_ptr<ActorCell> resolve(std::uint64_t id, const std::string& type);
  void add_cell(const std::shared_ptr<ActorCell>& cell);
  void forget(std::uint64_t id);
  void shutdown();
  // Makes in-process actor `cell` callable from other processes of the cluster (defect 6): the
  // head numbers it (a cluster id, unique in the cluster) and records where it is called (this
  // process's link address, listening from then on); this process hosts it under that id too.
  // Once per actor; returns the cluster id. Throws ErrorException when it cannot be done.
  std::uint64_t export_cell(const std::shared_ptr<ActorCell>& cell);

  const RuntimeConfig& config() const { return config_; }
  cluster::ClusterClient& cluster();   // connects (or starts the embedded cluster) on first use
  // This process's links to others, made on first use with the cluster token (a worker's first,
  // to listen; a driver's when it first needs the cluster). Later calls return the same one.
  cluster::Peers& peers(const std::string& token, const std::string& role = "");
  caf::actor_system& system() { return *system_; }

 private:
  static caf::actor_system_config& configure(caf::actor_system_config& cfg, const RuntimeConfig& rc);
  std::shared_ptr<ActorCell> spawn_local(std::uint64_t id, const ActorTypeInfo& type, Factory factory,
                                         Payload ctor_args, const Options& opts, HostContext ctx);

  RuntimeConfig config_;
  caf::actor_system_config caf_config_;
  std::unique_ptr<caf::actor_system> system_;
  DeadlineTimer timer_;
  mutable std::mutex mu_;
  bool shut_down_ = false;
  std::unordered_map<std::uint64_t, std::shared_ptr<ActorCell>> cells_;
  std::atomic<std::uint64_t> next_id_{1};
  std::mutex cluster_mu_;
  std::unique_ptr<EmbeddedCluster> embedded_;
  std::unique_ptr<cluster::ClusterClient> client_;
  std::mutex peers_mu_;
  std::unique_ptr<cluster::Peers> peers_;
  std::mutex export_mu_;   // one export at a time (each asks the head once)
  std::unordered_map<std::uint64_t, std::uint64_t> exported_;   // local id -> cluster id; under mu_
};

}  // namespace troupe::detail
