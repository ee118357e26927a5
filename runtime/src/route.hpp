// Route: how one attempt of a call reaches the actor's current incarnation. The call table
// (ActorCell) owns every call's fate — deadlines, retries, order, death — and hands each attempt to
// the route it is bound to; only the route knows whether the actor is in this process (the CAF
// mailbox, no copy: LocalRoute) or in another (cluster/remote_route.hpp).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "troupe/codec.hpp"
#include "troupe/detail/state.hpp"
#include "troupe/error.hpp"

namespace troupe::detail {

class ActorCell;
class Route;

// One attempt of call `seq`, as the table hands it to a route.
struct Attempt {
  std::uint64_t seq = 0;
  const char* method = nullptr;         // valid for the duration of send()
  Payload args;                         // the route's to keep (the table kept its own copy if it needs one)
  std::shared_ptr<StateBase> state;     // completed directly by local routes
};

// What became of an attempt.
struct Sent {
  // The route that carried it (one may pass it to its fallback). Null without an error: it could
  // not be sent now (the route is ending) and the route left attempt.args as it got them; the
  // table keeps the call for the next bind.
  const Route* via = nullptr;
  std::vector<std::uint64_t> regions;   // data-plane regions exposed for it: released when it ends
  std::optional<Error> error;           // it cannot be sent at all (e.g. its tensors): fail the call
};

class Route {
 public:
  virtual ~Route() = default;
  // The incarnation this route reaches (FT-2: replies of another are ignored). 0 for local routes.
  virtual std::uint64_t incarnation() const = 0;
  // Local routes complete calls through the cell (by the state they were handed), are bound once
  // and never replaced, so the table sends on them without its send lock. Remote routes answer by
  // (incarnation, seq) through ActorCell::take_reply.
  virtual bool local() const = 0;
  // Delivers the attempt. Called in submission order per cell for remote routes. Never throws.
  // Takes attempt.args only when it sends (or fails) the call.
  virtual Sent send(Attempt&& attempt) = 0;
  // Local routes: hands a call over with nothing to record (no regions, no failure to report):
  // the table's fast path, a call to an actor of this process. send() by default.
  virtual void post(const char* method, Payload&& args, std::shared_ptr<StateBase>&& state) {
    (void)send(Attempt{0, method, std::move(args), std::move(state)});
  }
  // Local routes: whether the caller may run a call on its own thread now, the actor being
  // constructed and running no call. True holds the actor until run_claimed() has run the call
  // (nothing else runs on it meanwhile). Never blocks.
  virtual bool try_claim() { return false; }
  // Local routes: whether the actor's own thread is this one, lent to a call of another actor of
  // its share group (troupe/share_thread.hpp): a call to it from here, posted, would wait for this
  // very thread, so the table runs it here when it may (ActorCell::submit).
  virtual bool lent_to_this_thread() const { return false; }
  // Runs the call claimed by try_claim() on this thread, completes `state` through `cell` as the
  // host would, and lets go of the actor.
  virtual void run_claimed(const std::shared_ptr<ActorCell>& cell, const char* method, const Payload& args,
                           const std::shared_ptr<StateBase>& state) {
    (void)cell, (void)method, (void)args, (void)state;
  }
  // Where calls go when this route breaks with the actor still alive (ActorCell::route_broken);
  // null: they wait for the next bind.
  virtual std::shared_ptr<Route> fallback() const { return nullptr; }
  // The actor is dead to this process: a local route stops its host. Idempotent.
  virtual void stop() {}
};

}  // namespace troupe::detail
