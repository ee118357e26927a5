// Peers: this process's links to other troupe processes (net/link.hpp), and what travels on them
// for actor calls. One per runtime, shared by both roles a process can play:
// - serving: a worker listens; a call for an actor it hosts ('C') goes to that actor's host, whose
//   reply goes back on the same link ('R'); a call for an actor not hosted here (another
//   incarnation, FT-2) is answered ActorDied at once;
// - calling: the cluster client opens one link per peer process, sends calls on it through
//   LinkRoutes, completes the calls that replies answer, and tells the callee when it has pulled a
//   result's tensors ('L', release notices). A reply that carries tensors to pull is completed on a
//   thread of its own, so that a transfer never holds up the link's io thread.
// A link's end is reported once, with its cause, to whoever is told of link losses.
#pragma once

#include <caf/actor.hpp>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "troupe/net/link.hpp"

namespace troupe::detail {
class RuntimeImpl;
class LocalRoute;
}

namespace troupe::cluster {

class Peers {
 public:
  // Called on the io thread when a link to a peer ends (net::LinkEnd says how).
  using LossHandler = std::function<void(const net::Link& link, net::LinkEnd end, const std::string& why)>;

  Peers(detail::RuntimeImpl& rt, std::string token, std::string role);
  ~Peers();   // stop()
  Peers(const Peers&) = delete;
  Peers& operator=(const Peers&) = delete;

  // Serving: listens on `bind`; returns "host:port". Throws ErrorException (NetCode) if it cannot.
  std::string listen(const std::string& bind);
  std::string address() const;   // what listen() returned; "" before
  // The table of actors hosted here that other processes may call.
  void host(std::uint64_t actor_id, std::uint64_t incarnation, std::shared_ptr<detail::LocalRoute> host);
  void unhost(std::uint64_t actor_id);

  // Calling: the link to the process at `address`, connected (and authenticated) on first use,
  // or null (the reason logged) when it cannot be reached.
  std::shared_ptr<net::Link> link_to(const std::string& address);
  void on_loss(LossHandler handler);

  // Closes every link and joins every thread. Idempotent.
  void stop();
  net::LinkHub::Counts counts() const { return hub_->counts(); }   // messages this process's links carried
  net::LinkHub& hub() { return *hub_; }   // for the link to the head (ClusterClient)

 private:
  void on_message(net::Link& link, char kind, std::vector<char>& body);
  void serve_call(net::Link& link, std::vector<char>& body);
  void take_reply(net::Link& link, std::vector<char>& body);
  void on_closed(net::Link& link, net::LinkEnd end, const std::string& why);
  net::Link::MessageHandler message_handler();
  net::Link::ClosedHandler closed_handler();
  std::shared_ptr<detail::LocalRoute> find(std::uint64_t actor_id, std::uint64_t incarnation) const;

  detail::RuntimeImpl& rt_;
  std::unique_ptr<net::LinkHub> hub_;
  mutable std::mutex mu_;
  std::map<std::uint64_t, std::pair<std::shared_ptr<detail::LocalRoute>, std::uint64_t>> hosted_;   // id -> host, incarnation
  std::map<std::string, std::shared_ptr<net::Link>> outbound_;             // by the peer's address
  std::vector<std::shared_ptr<net::Link>> inbound_;
  std::mutex loss_mu_;   // held while the loss handler runs: on_loss() waits out a running one
  LossHandler on_loss_;
  struct Fetcher {   // a reply whose tensors are being pulled
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  std::vector<Fetcher> fetchers_;   // joined when done (at the next one) or at stop()
  bool stopping_ = false;
  std::string token_, role_;
  std::string address_;   // under mu_
};

}  // namespace troupe::cluster
