// ActorCell: the call table of one actor, shared by every ActorRef to it. It holds the actor's
// calls in flight in submission order and decides each one's fate: sent on the route the actor is
// bound to (route.hpp), queued while it has none, resent in order after a restart or a broken
// route (max_retries), failed with ActorDied on death, with Unavailable when a route broke under
// a live actor and no retry is left, with Timeout at its deadline (FT-1). Replies from another
// incarnation are ignored (FT-2). It knows no CAF and no socket: its routes and its env do.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "deadline_timer.hpp"
#include "route.hpp"
#include "spin_lock.hpp"
#include "troupe/codec.hpp"
#include "troupe/detail/state.hpp"
#include "troupe/future.hpp"

namespace troupe::detail {

// A call of this process gets an expected reply time (its waiter's window, StateBase::wait_until)
// only when its method runs at least this long on its host: a shorter one's reply comes within the
// waiter's first spin. The host times (two clock reads) a method's first call, one call in 1,024
// after, and every call once one has run this long (actor_host.cpp, HostState::timed).
inline constexpr std::chrono::microseconds kLocalExpectFrom{20};

// The table's dependencies, injected: tests pass a manual timer and a counting release.
struct CallTableEnv {
  Timer* timer = nullptr;                                               // deadlines; null: none fire
  void (*release)(const std::vector<std::uint64_t>& regions) = nullptr;   // regions of an ended attempt
};

struct CellSpec {
  std::uint64_t id = 0;
  std::string type;                               // the registered type name
  std::string label;                              // "counter#3", in errors and logs
  std::chrono::nanoseconds default_timeout{0};    // a call's deadline when it sets none; 0: none
  int max_retries = 0;                            // resends of a call whose attempt was lost
  bool remote = false;                            // hosted by another process (killed through the head)
};

class ActorCell : public std::enable_shared_from_this<ActorCell> {
 public:
  ActorCell(CellSpec spec, CallTableEnv env);
  ~ActorCell();   // mark_dead("was released")
  ActorCell(const ActorCell&) = delete;
  ActorCell& operator=(const ActorCell&) = delete;

  std::uint64_t id() const { return spec_.id; }
  const std::string& type() const { return spec_.type; }
  const std::string& label() const { return spec_.label; }
  bool remote() const { return spec_.remote; }

  // Sends the call on the bound route, queues it while none is, or fails it at once if the actor
  // is dead. `timeout` <= 0 takes the cell's default. Never throws.
  // `here`: the caller waits for the call right away (ActorRef::call_sync). If the actor is in this
  // process, constructed, with no call in flight, and the call has no deadline, the call runs on
  // the caller's thread before submit returns, as the host would run it (in order: every later
  // call waits for it), and nothing wakes the host.
  void submit(const char* method, Payload args, std::shared_ptr<StateBase> state, std::chrono::nanoseconds timeout,
              bool here = false);

  // The actor runs behind `route` now (its first incarnation, or a new one): queued calls, and
  // those being retried, are sent on it in submission order before any newer call.
  void bind(std::shared_ptr<Route> route);
  // The route to `incarnation` is gone with its process: calls sent on it are resent at the next
  // bind when max_retries allows, else fail with ActorDied; later calls queue until bind().
  void unbind(std::uint64_t incarnation, const std::string& reason);
  // `route` broke with the actor possibly alive: the table moves to route->fallback(); calls sent
  // on it are resent there when max_retries allows, else fail with Unavailable (they may have run).
  void route_broken(const Route* route, const std::string& reason);
  std::shared_ptr<Route> route() const;

  // Local routes: the host completes the call it was handed. A call already done ignores it.
  // `ran`: how long the host ran the call's method `method`, when it timed it (actor_host.cpp:
  // kLocalExpectFrom): the method's typical time tells later callers' waiters when to look for
  // their replies (submit; StateBase::wait_until). Zero: not timed.
  void complete(StateBase& call, const Payload& reply, const char* method = nullptr,
                std::chrono::nanoseconds ran = std::chrono::nanoseconds::zero());
  // When a call of `method` is expected to be answered, after it was sent (reply_times_); zero
  // while none has been timed.
  std::chrono::nanoseconds typical_reply_time(std::string_view method) const;
  void fail_call(StateBase& call, Error error);
  // Remote routes: the call that a reply of (incarnation, seq) answers, taken out of the table
  // (its regions released, its deadline cancelled) for the caller to complete; null when no
  // attempt of that call is in flight to that incarnation (FT-2) or it was done already.
  std::shared_ptr<StateBase> take_reply(std::uint64_t incarnation, std::uint64_t seq);

  // Marks the actor dead: every call in flight fails with ActorDied(reason), later ones at once,
  // and the route is stopped (a local host exits). False if it was dead already.
  bool mark_dead(const std::string& reason);
  // The same with `error` itself: an actor that never started (the head refused its spawn) fails
  // ready() and every call with the refusal's code and message.
  bool mark_failed(Error error);
  bool dead() const { return dead_.load(std::memory_order_acquire); }
  // An in-process actor made callable from other processes (RuntimeImpl::export_cell): calls
  // that arrive on a link must carry `token` and name `incarnation`. Empty token (the default):
  // no call from outside is served.
  struct Served {
    std::string token;
    std::uint64_t incarnation = 0;
  };
  void serve_remote(Served s) {
    std::lock_guard lk(mu_);
    served_ = std::move(s);
  }
  Served served() const {
    std::lock_guard lk(mu_);
    return served_;
  }
  // Completes when the actor's constructor has run (or fails if it threw / the actor died).
  Future<void> ready() const { return ready_.future(); }
  void set_ready() { ready_.set_value(); }

 private:
  bool end(Error error);
  struct Pending {   // a call to send on a route, taken from the table under its lock
    std::uint64_t seq;
    std::string method;
    Payload args;
    std::shared_ptr<StateBase> state;
  };

  void link(const std::shared_ptr<StateBase>& call);     // mu_ held
  // mu_ held. Unlinks the call; its exposed regions go to `regions`. Null if already done.
  std::shared_ptr<StateBase> unlink(StateBase& call, std::vector<std::uint64_t>* regions = nullptr);
  // Unlinks, releases, cancels the deadline; notes `ran` as `method`'s time (complete) if given.
  std::shared_ptr<StateBase> take(StateBase& call, const char* method = nullptr,
                                  std::chrono::nanoseconds ran = std::chrono::nanoseconds::zero());
  // A call whose attempt could not be sent at all, to fail once send_mu_ is let go: its callbacks
  // may call this cell again (submit takes send_mu_).
  struct Unsendable {
    std::shared_ptr<StateBase> state;
    Error error;
  };
  // send_mu_ held, mu_ not: one attempt, and what it left behind; a call it could not send at all
  // goes to `unsendable`.
  void deliver(Route& route, Pending p, std::vector<Unsendable>& unsendable);
  static void fail_unsendable(std::vector<Unsendable>& unsendable);
  // send_mu_ and mu_ held: calls in flight on a route that `lost` selects lost their attempt.
  // Those with a retry left become unsent (their seqs returned, in order); the others go to `failed`.
  std::vector<std::uint64_t> withdraw_locked(const std::function<bool(const Route*)>& lost,
                                             std::vector<std::shared_ptr<StateBase>>& failed,
                                             std::vector<std::uint64_t>& regions);
  // mu_ held: call `seq`, about to be sent on `route`, as a Pending (its args copied while it
  // may be resent, else moved out).
  Pending take_for_send_locked(std::uint64_t seq, const Route* route);
  // mu_ held: an attempt of the call goes out now; its waiter learns when to expect the reply.
  void sending_locked(CallRecord& rec, StateBase& call);
  static constexpr std::size_t kReplyTimes = 5;
  struct ReplyTime {   // a method's latest reply times (reply_times_)
    std::string method;
    std::array<std::chrono::nanoseconds, kReplyTimes> last{};   // a ring: `count` of them hold one
    std::size_t count = 0, next = 0;                              // next: where the next one goes
    std::chrono::nanoseconds typical{0};   // their median (of an even count, the shorter middle one)
  };
  const ReplyTime* reply_time_locked(std::string_view method) const;   // mu_ held; null: none yet
  ReplyTime* reply_time_locked(std::string_view method) {
    return const_cast<ReplyTime*>(std::as_const(*this).reply_time_locked(method));
  }
  void note_reply_time_locked(std::string_view method, std::chrono::nanoseconds took);   // mu_ held
  void fail_all(std::vector<std::shared_ptr<StateBase>>& calls, std::vector<std::uint64_t>& regions,
                const Error& error);
  void release(std::vector<std::uint64_t>& regions) const;
  Timer::Key schedule_deadline(const std::shared_ptr<StateBase>& call, const char* method,
                               std::chrono::nanoseconds timeout);

  // What every call touches, together (a caller and the actor's thread take mu_ per call).
  mutable SpinLock mu_;  // guards the fields below it, but for the const ones
  std::atomic<bool> dead_{false};
  bool route_local_ = false;
  // Published only once every queued call has been sent on it (so newer calls never overtake);
  // a local route, once bound, is replaced by nothing but death.
  std::shared_ptr<Route> route_;
  StateBase* head_ = nullptr;   // oldest call in flight
  StateBase* tail_ = nullptr;
  std::uint64_t next_seq_ = 1;
  std::uint64_t route_incarnation_ = 0;
  Error death_error_;   // what every call fails with once dead
  Served served_;
  std::unordered_map<std::uint64_t, StateBase*> recorded_;   // calls with a CallRecord, by seq
  // Per method, how long its calls took: on a remote route from send to reply, on a local one the
  // host's run of a long method (kLocalExpectFrom). Each new call tells its waiter when to expect
  // the reply (StateBase::expect_reply): the median of the method's last kReplyTimes. A method's
  // first call is often many times its later ones (first-touch page faults, allocations, cold
  // caches: rl_step's first DPO generate through a worker process took 41 ms, the next ones ~11
  // ms), and the moving average this was before took ten calls and more to forget one, its waiters
  // meanwhile asleep well past their replies (each then woken by the replier: ~50 us of that
  // thread's time and ~100-300 us to wake on a small VM, 2026-12-06). The median forgets it
  // after two calls, and follows a change of pace after three. An actor has a few methods: looked
  // for in order.
  std::vector<ReplyTime> reply_times_;

  const CellSpec spec_;
  const CallTableEnv env_;
  std::mutex send_mu_;   // orders sends on remote routes: a rebind's resends before newer calls
  Promise<void> ready_;
};

}  // namespace troupe::detail
