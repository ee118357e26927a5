// ActorCell: the caller-side record of one actor, shared by every ActorRef to it. It owns where
// the actor is (a local host, or a remote gateway and incarnation) and the list of its calls in
// flight, so that a death, a kill or a deadline fails exactly the calls it concerns (FT-1), and
// a restart retries them in submission order (the list's order).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/allowed_unsafe_message_type.hpp>

#include "cluster/wire.hpp"
#include "deadline_timer.hpp"
#include "spin_lock.hpp"
#include "troupe/codec.hpp"
#include "troupe/detail/state.hpp"
#include "troupe/future.hpp"

namespace troupe::detail {

// The message a caller sends to a local actor's host. The payload's tensors are views.
struct CallMsg {
  std::shared_ptr<StateBase> call;   // its call_link is guarded by the cell
  std::string method;
  Payload args;
};

}  // namespace troupe::detail

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::detail::CallMsg)

namespace troupe::cluster {
class CallChannel;
}

namespace troupe::detail {

// Where a remote actor runs now.
struct RemoteBinding {
  caf::actor gateway;          // the worker process's gateway (a middleman proxy): watched for its death
  std::string address;         // "host:port" of that gateway
  caf::actor host;             // the actor's host in that process: calls go straight to it (SEC-1
                               // and FT-2 are checked there)
  std::uint64_t incarnation = 0;
  std::shared_ptr<cluster::CallChannel> channel;   // the fast path to that process; null: the host
};

// What a remote cell needs to build and retry calls.
struct RemoteSettings {
  std::string token;
  caf::actor reply_to;         // this process's router
  int max_retries = 0;         // resends of a call whose actor died while it was in flight
};

class ActorCell : public std::enable_shared_from_this<ActorCell> {
 public:
  ActorCell(std::uint64_t id, std::string type, std::string label, DeadlineTimer* timer,
            std::chrono::nanoseconds default_timeout);
  ~ActorCell();

  std::uint64_t id() const { return id_; }
  const std::string& type() const { return type_; }
  const std::string& label() const { return label_; }

  // Local actors: the host's handle.
  void set_handle(caf::actor handle);
  caf::actor handle() const;
  // Remote actors: makes this cell remote; calls queue until bind().
  void make_remote(RemoteSettings settings);
  bool is_remote() const { return remote_ != nullptr; }

  // Sends a call, queues it (remote, not bound yet), or fails it at once if the actor is dead.
  void submit(const char* method, Payload args, std::shared_ptr<StateBase> state,
              std::chrono::nanoseconds timeout);

  // Host side of a local call: the reply or failure. A call already failed ignores it.
  void complete(StateBase& call, const Payload& reply);
  void fail_call(StateBase& call, Error error);

  // Remote: the actor now runs at `b`; queued and retried calls are sent, in order.
  void bind(RemoteBinding b);
  // Remote: the process hosting incarnation `incarnation` died or was replaced. Calls sent to it
  // are retried (max_retries) or fail with ActorDied; later calls queue until bind().
  void unbind(std::uint64_t incarnation, const std::string& reason);
  // The binding's call channel `channel` broke with the actor possibly alive: the binding goes on
  // through the middleman; calls whose attempt went over that channel get no reply from it, so
  // they are resent when max_retries allows, else fail with Unavailable (they may have run).
  void drop_channel(const cluster::CallChannel* channel, const std::string& reason);
  std::optional<RemoteBinding> binding() const;
  // Remote: a reply arrived (on the router's thread). Pulls its tensors and completes the call.
  void on_reply(const WireReply& r);

  // Marks the actor dead and fails every call in flight with ActorDied(reason). Returns the
  // handle it held (to be stopped by the caller), or an invalid one if it was already dead.
  caf::actor mark_dead(const std::string& reason);
  bool dead() const { return dead_.load(std::memory_order_acquire); }
  std::size_t in_flight() const;
  // Completes when the actor's constructor has run (or fails if it threw / the actor died).
  Future<void> ready() const { return ready_.future(); }
  void set_ready() { ready_.set_value(); }

 private:
  struct RemoteCall {
    std::string method;
    Payload args;
    int attempts = 0;
    bool sent = false;
    bool on_channel = false;              // this attempt went over the binding's call channel
    std::vector<std::uint64_t> regions;   // argument tensors exposed for this attempt
  };
  struct Remote {
    RemoteSettings settings;
    std::optional<RemoteBinding> binding;
    std::map<std::uint64_t, RemoteCall> calls;         // by seq: submission order
    std::map<std::uint64_t, std::weak_ptr<StateBase>> states;
    std::mutex send_mu;   // orders sends: a rebind's resends go out before newer calls
  };

  std::shared_ptr<StateBase> take(StateBase& call);       // unlinks; null if already done
  void link(const std::shared_ptr<StateBase>& call);     // lock held
  // Lock held. For remote cells also drops the call's record, moving its exposed argument
  // regions to `regions` (to release once the lock is dropped).
  std::shared_ptr<StateBase> unlink(StateBase& call, std::vector<std::uint64_t>* regions = nullptr);
  // unbind() and drop_channel(): withdraw the lost attempts of calls in flight (under send_mu and
  // mu_), then release their regions and fail those without a retry left (no lock held).
  std::vector<std::uint64_t> withdraw_locked(const std::function<bool(const RemoteCall&)>& lost,
                                             std::vector<std::shared_ptr<StateBase>>& failed,
                                             std::vector<std::uint64_t>& regions);
  void fail_withdrawn(std::vector<std::shared_ptr<StateBase>>& failed, std::vector<std::uint64_t>& regions,
                      const Error& error);
  DeadlineTimer::Key schedule_deadline(const std::shared_ptr<StateBase>& call, const char* method,
                                       std::chrono::nanoseconds timeout);
  void submit_remote(const char* method, Payload args, std::shared_ptr<StateBase> call);
  // Builds and sends one attempt of call `seq` (send_mu held, mu_ not held).
  void send_remote(std::uint64_t seq, const RemoteBinding& b, const std::string& method, const Payload& args);

  const std::uint64_t id_;
  const std::string type_;
  const std::string label_;
  DeadlineTimer* const timer_;
  const std::chrono::nanoseconds default_timeout_;

  mutable SpinLock mu_;
  caf::actor handle_;
  std::atomic<bool> dead_{false};
  std::string death_reason_;
  StateBase* head_ = nullptr;   // oldest call in flight
  StateBase* tail_ = nullptr;
  std::size_t count_ = 0;
  std::uint64_t next_seq_ = 1;
  std::unique_ptr<Remote> remote_;   // set once, before the cell is shared, for remote actors
  Promise<void> ready_;
};

}  // namespace troupe::detail
