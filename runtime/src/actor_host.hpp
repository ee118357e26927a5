// The host: the CAF actor that owns one user object and runs its calls, one at a time, in order.
// Local calls (CallMsg, tensors as views) arrive by LocalRoute and complete through the cell;
// calls from other processes (a link's ChannelCall) are answered on its ReplySink. Either way the method's outcome is one Result: a value, or the Error
// it failed with, intact (troupe::ErrorException), or MethodFailed for any other exception.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/allowed_unsafe_message_type.hpp>

#include "actor_cell.hpp"
#include "cluster/wire.hpp"
#include "route.hpp"
#include "troupe/registry.hpp"

namespace troupe::detail {

// A call from this process. The payload's tensors are views.
struct CallMsg {
  std::shared_ptr<StateBase> call;   // its CallLink is guarded by the cell
  std::string method;
  Payload args;
};

// Where a host sends the reply of a call from another process (its link, cluster/peers.cpp).
class ReplySink {
 public:
  virtual ~ReplySink() = default;
  // `more`: further calls wait in the host's mailbox, so the reply may be batched with theirs.
  virtual void reply(const WireReply& r, bool more) = 0;
  // Tensors of the reply up to this many bytes go in it (to_wire's inline_max; 0: its default).
  virtual std::size_t inline_max() const { return 0; }
};

// A call from another process, as its host receives it (a local CAF message, never serialised).
struct ChannelCall {
  WireCall call;
  std::shared_ptr<ReplySink> sink;
};

}  // namespace troupe::detail

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::detail::CallMsg)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::detail::ChannelCall)

namespace troupe::detail {

// A call to this method name completes, with no value, once the host has run every call queued
// to it before this one: a barrier (a draining worker reports its actor drained after it).
inline constexpr const char* kBarrierMethod = "troupe.barrier";

struct HostContext {
  std::uint64_t incarnation = 0;                   // in worker processes: the head's
  std::string token;                               // remote calls must carry it (SEC-1)
  std::chrono::milliseconds fetch_timeout{60000};  // pulling a remote call's tensor arguments
};

// The user object a host runs calls on, shared by the host and its route. Every call runs holding
// `running`: the host's own, and a synchronous call that a caller runs on its own thread because
// it found the actor idle (LocalRoute::try_claim). The object is set once constructed and cleared,
// under `running`, when the host destroys it at its exit.
struct HostedObject {
  std::mutex running;
  // Calls posted to the host's mailbox and not yet begun, from this process and from others (the
  // host counts one down once it holds `running`): a caller runs its own call only when none
  // waits, so that none is overtaken, one whose deadline failed it while it waited included (it
  // still runs); and a thread of its share_group runs a call for it only then too.
  std::atomic<std::int64_t> posted{0};
  void* object = nullptr;                      // guarded by running
  const ActorTypeInfo* type = nullptr;
  HostContext ctx;
  std::string label;
  // Deferred replies not yet sent (methods that returned a Future), guarded by running: failed
  // when the host exits, so that no caller waits for an answer from an actor that is gone.
  std::vector<Future<Payload>> pending;
  // Between calls from other processes the host's thread sleeps on `bell` and on this process's
  // lanes for a while (actor_host.cpp, linger) rather than on its mailbox: whoever posts to the
  // host rings it after (LocalRoute).
  std::atomic<std::uint32_t> bell{0};
  std::atomic<bool> sleeping{false};
  // The id other processes' calls address it by (cluster::Peers::host), 0 until it is served to
  // them: asleep there, the host waits for that id's calls, which wake its thread itself
  // (net::LaneWatch::sleep's `waits_for`) rather than another host's of this process.
  std::atomic<std::uint64_t> remote_id{0};
  // The group of hosts of this process that share their threads (troupe/share_thread.hpp), 0 for
  // none: a call from another process for this host that the looking thread of another host of the
  // group takes runs on that thread when this host is idle (LocalRoute::deliver).
  std::atomic<std::uint64_t> share_group{0};
  // Its thread runs a call it took for another host of its group: no other thread of the group
  // takes a call for it meanwhile (its calls wait for its thread, as on one thread).
  std::atomic<bool> lent{false};
  void ring();
};

class LocalRoute;

// Spawns the host and returns the route to it. The constructor runs first, on the host's own
// thread when `detached`; if it throws, the cell is marked dead with the exception's message and
// the host stops.
std::shared_ptr<LocalRoute> spawn_host(caf::actor_system& sys, bool detached, std::shared_ptr<ActorCell> cell,
                                       const ActorTypeInfo& type, Factory factory, Payload ctor_args, HostContext ctx);

// The route to a host in this process: its mailbox, or the caller's own thread (see try_claim).
class LocalRoute final : public Route {
 public:
  LocalRoute(caf::actor host, std::shared_ptr<HostedObject> hosted, std::weak_ptr<ActorCell> cell = {})
      : host_(std::move(host)), hosted_(std::move(hosted)), cell_(std::move(cell)) {}
  std::uint64_t incarnation() const override { return 0; }
  bool local() const override { return true; }
  Sent send(Attempt&& attempt) override;
  void post(const char* method, Payload&& args, std::shared_ptr<StateBase>&& state) override;
  bool try_claim() override;
  bool lent_to_this_thread() const override;
  void run_claimed(const std::shared_ptr<ActorCell>& cell, const char* method, const Payload& args,
                   const std::shared_ptr<StateBase>& state) override;
  void stop() override;   // the host exits; its running call finishes first
  void deliver(ChannelCall&& call);   // a call from another process (cluster::Peers)
  void set_remote_id(std::uint64_t id) { hosted_->remote_id.store(id); }   // cluster::Peers::host
  const caf::actor& host() const { return host_; }

 private:
  caf::actor host_;
  std::shared_ptr<HostedObject> hosted_;
  std::weak_ptr<ActorCell> cell_;   // the cell owns its route
};

}  // namespace troupe::detail
