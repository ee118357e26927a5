// ClusterClient: a process's link to the cluster. It asks the head to spawn and kill actors,
// binds remote ActorCells to the worker processes that host them (following restarts through
// the head's directory), and routes replies back to the cells. One per Runtime, created when
// the first remote actor is spawned or referenced.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <nlohmann/json.hpp>

#include "actor_cell.hpp"
#include "cluster/call_channel.hpp"
#include "troupe/options.hpp"
#include "troupe/registry.hpp"

namespace troupe::detail {
class RuntimeImpl;
}

namespace troupe::cluster {

struct HeadEndpoint {
  std::string host;
  std::uint16_t port = 0;
  std::string token;
};

class ClusterClient {
 public:
  ClusterClient(detail::RuntimeImpl& rt, caf::actor_system& sys, HeadEndpoint head,
                detail::Timer* timer, std::chrono::milliseconds call_timeout);
  ~ClusterClient();   // stop()

  // Asks the head for a new actor; returns its cell at once (calls queue until it runs).
  // Throws CallError (BadArguments: refused spec; Unavailable: head unreachable).
  std::shared_ptr<detail::ActorCell> spawn(const detail::ActorTypeInfo& type, const std::string& signature,
                                           const Payload& ctor_args, const Options& opts);
  // A cell for an existing cluster actor (an ActorRef received in a message), or null.
  std::shared_ptr<detail::ActorCell> attach(std::uint64_t id, const std::string& type);
  void kill(const std::shared_ptr<detail::ActorCell>& cell);
  // Kills the actors this client spawned (a driver's actors end with it) unless `keep_actors`,
  // then stops the directory watcher. Idempotent.
  void stop(bool keep_actors);

  const HeadEndpoint& head() const { return head_; }
  // One head API call; throws CallError (BadArguments for 400/409, Unavailable otherwise).
  nlohmann::json request(const std::string& method, const std::string& target, const nlohmann::json& body) {
    return call_head(method, target, body);
  }
  // Router side: a monitored gateway's process is gone.
  void on_gateway_down(const caf::actor_addr& gateway);
  // A channel's reader: its connection to the worker at `address` (gateway) ended.
  void on_channel_broken(const std::string& address, const CallChannel* channel, bool closed_here);

 private:
  std::shared_ptr<detail::ActorCell> make_cell(std::uint64_t id, const std::string& type, const std::string& name,
                                               int max_retries, std::chrono::milliseconds timeout);
  nlohmann::json call_head(const std::string& method, const std::string& target, const nlohmann::json& body);
  void watch_loop();
  void apply(const nlohmann::json& actor);
  caf::actor connect(const std::string& address);
  // The call channel to the worker behind `gateway` (cached per address); null if it has none
  // or cannot be reached, and calls then go through the middleman.
  std::shared_ptr<CallChannel> channel(const std::string& address, const caf::actor& gateway);

  detail::RuntimeImpl& rt_;
  caf::actor_system& sys_;
  HeadEndpoint head_;
  detail::Timer* timer_;
  std::chrono::milliseconds call_timeout_;
  caf::actor router_;
  std::mutex mu_;
  std::map<std::uint64_t, std::weak_ptr<detail::ActorCell>> cells_;
  std::set<std::uint64_t> owned_;
  std::map<std::string, caf::actor> gateways_;   // by "host:port"
  std::map<std::string, std::shared_ptr<CallChannel>> channels_;   // by gateway "host:port"
  std::vector<std::shared_ptr<CallChannel>> retired_;              // broken, replaced: joined at stop()
  std::atomic<bool> stopping_{false};
  std::thread watcher_;
};

}  // namespace troupe::cluster
