// ClusterClient: a process's link to the cluster. It holds the process's one link to the head
// (net/head_link.hpp), on which the head pushes the directory's changes (and, in a worker
// process, the worker's orders); it asks the head to spawn and kill actors (HTTP, the operators'
// API), binds remote ActorCells to the worker processes that host them (following restarts as the
// head pushes them) with a LinkRoute on the link to that process (Peers), and turns the end of a
// link into what it means for the calls on it. One per Runtime, created when the first remote
// actor is spawned or referenced.
#pragma once

#include <atomic>
#include <functional>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "actor_cell.hpp"
#include "troupe/net/head_link.hpp"
#include "troupe/net/link.hpp"
#include "troupe/future.hpp"
#include "troupe/options.hpp"
#include "troupe/registry.hpp"

namespace troupe::detail {
class RuntimeImpl;
}

namespace troupe::cluster {

class Peers;

struct HeadEndpoint {
  std::string host;
  std::uint16_t port = 0;
  std::string token;
};

class ClusterClient {
 public:
  // Opens the link to the head; throws CallError(Unavailable) if it cannot be reached in time,
  // or refuses (a wrong token).
  ClusterClient(detail::RuntimeImpl& rt, Peers& peers, HeadEndpoint head, detail::Timer* timer,
                std::chrono::milliseconds call_timeout);
  ~ClusterClient();   // stop()

  // Asks the head for a new actor; returns its cell at once (calls queue until it runs).
  // Throws CallError (BadArguments: refused spec; Unavailable: head unreachable).
  std::shared_ptr<detail::ActorCell> spawn(const detail::ActorTypeInfo& type, const std::string& signature,
                                           const Payload& ctor_args, const Options& opts);
  // A cell for an existing cluster actor (an ActorRef received in a message), or null.
  std::shared_ptr<detail::ActorCell> attach(std::uint64_t id, const std::string& type);
  void kill(const std::shared_ptr<detail::ActorCell>& cell);
  // Registers an in-process actor at the head as callable at `gateway` (this process's link
  // address); owned by this client, like what it spawns. The cluster id. Throws CallError.
  std::uint64_t host_actor(const std::string& type, const std::string& name, const std::string& gateway);
  // The address of this host that the head's host reaches: where other processes can call this one.
  std::string advertise_host() const;
  // Kills the actors this client spawned (a driver's actors end with it) unless `keep_actors`,
  // then stops the directory watcher. Idempotent.
  void stop(bool keep_actors);

  const HeadEndpoint& head() const { return head_; }
  // What this process creates is owned by this id at the head (JOB-1): it goes when the link ends.
  std::uint64_t owner() const { return owner_; }
  // One head API call; throws CallError (BadArguments for 400/409, Unavailable otherwise).
  nlohmann::json request(const std::string& method, const std::string& target, const nlohmann::json& body) {
    return call_head(method, target, body);
  }
  // In a worker process: says hello as worker `id` (callers link to `address`) on the head link.
  // `on_order` then gets, on the client's own thread, the head's welcome (its first call), each
  // order, and {"kind": "head_lost", "why"} once if the link to the head ends.
  using OrderHandler = std::function<void(const nlohmann::json& order)>;
  void serve_as_worker(std::uint64_t id, const std::string& address, OrderHandler on_order);
  // Reports events to the head ({"events": events}); false once the link to the head has ended.
  bool send_events(const nlohmann::json& events);
  // Completes once placement group `id` is CREATED (every bundle reserved), as the head pushes
  // it; fails with PlacementCode::NotFound once it is removed. No request waits for it.
  Future<void> group_ready(std::uint64_t id);
  // The group's state from the head's answer to its creation: taken only if no push came first.
  void seed_group(std::uint64_t id, const std::string& state);
  // This process removed it: its futures fail now, not when the head's push comes.
  void group_removed(std::uint64_t id);
  // Elastic groups (troupe/elastic.hpp). create: the head's group id; throws CallError.
  std::uint64_t create_elastic(const detail::ActorTypeInfo& type, const std::string& signature, const Payload& ctor_args,
                               const Options& opts, const std::string& name, int min, int max);
  // The group's members running now, as the head pushed them, with a cell each (made on first sight).
  std::vector<std::shared_ptr<detail::ActorCell>> elastic_members(std::uint64_t group, const std::string& type,
                                                                  const Options& opts);
  // Waits until at least `min` members run, or `deadline`; false then, with the head's reason.
  bool wait_elastic(std::uint64_t group, std::size_t min, std::chrono::steady_clock::time_point deadline, std::string* why);

  // A link to a worker ended (on the io thread): its actors' calls learn what that means.
  void on_link_lost(const net::Link& link, net::LinkEnd end, const std::string& why);
  // The link to the head ended (on the watcher thread). Nothing places, restarts or links an
  // actor again for this process (it does not link to a head anew): an actor of the cluster not
  // bound to a live worker now never will be, so its calls fail (Unavailable, naming the loss)
  // rather than wait for a restart, and so do the waits for placement groups not yet created.
  // Actors whose workers are linked keep answering; one whose link ends later fails at once
  // (on_link_lost).
  void on_head_lost(const std::string& why);

 private:
  std::shared_ptr<detail::ActorCell> make_cell(std::uint64_t id, const std::string& type, const std::string& name,
                                               int max_retries, std::chrono::milliseconds timeout);
  nlohmann::json call_head(const std::string& method, const std::string& target, const nlohmann::json& body);
  void watch_loop();
  void apply(const nlohmann::json& actor);
  void apply_group(std::uint64_t id, const std::string& state, bool seed);

  detail::RuntimeImpl& rt_;
  Peers& peers_;
  HeadEndpoint head_;
  detail::Timer* timer_;
  std::chrono::milliseconds call_timeout_;
  std::mutex mu_;
  std::map<std::uint64_t, std::weak_ptr<detail::ActorCell>> cells_;
  std::set<std::uint64_t> owned_;
  // Each actor's latest directory entry, as pushed: one may arrive before its cell exists (it ran
  // before the spawn reply was read), and a cell made later starts from it.
  std::map<std::uint64_t, nlohmann::json> latest_;
  std::set<std::uint64_t> unlinked_;   // alive, but their worker could not be linked yet
  // Actors whose link ended with their worker perhaps alive and whose calls waited out the grace
  // (on_link_lost): linked again from their directory entry by the watcher, which `wake` rouses.
  // Shared with the grace timers, which may fire after this client is gone.
  struct Relinks {
    std::mutex mu;
    std::set<std::uint64_t> ids;
    std::function<void()> wake;
  };
  std::shared_ptr<Relinks> relinks_ = std::make_shared<Relinks>();
  std::string head_gone_;              // how the link to the head ended; empty while it lasts
  std::condition_variable directory_cv_;   // an entry of latest_ changed
  struct GroupWatch {
    std::string state;                    // as last pushed (or seeded); "" while unknown
    std::vector<Promise<void>> waiting;   // ready futures given out before it was CREATED
  };
  std::map<std::uint64_t, GroupWatch> groups_;   // every group seen (few), removed ones kept; under mu_
  std::atomic<bool> stopping_{false};
  std::unique_ptr<net::HeadSession> session_;   // the link to the head
  std::uint64_t owner_ = 0;
  std::mutex order_mu_;
  OrderHandler on_order_;
  std::thread watcher_;   // takes what the head pushes
};

}  // namespace troupe::cluster
