#include "actor_host.hpp"

#include <caf/all.hpp>

#include <algorithm>
#include <bit>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "troupe/actor_ref.hpp"
#include "troupe/net/link.hpp"
#include "troupe/net/token.hpp"
#include "troupe/share_thread.hpp"

namespace troupe::detail {
namespace {

// How long a host on its own thread looks for its next call after one before its thread parks.
// A synchronous caller's next call, or the next of a pipeline stage, usually comes within
// microseconds, while waking a parked thread costs ~50 us on a small VM (one futex wake and an
// idle vCPU's wake-up per call, the larger part of a call's cost there). A host with nothing coming
// stops looking kLinger after its last call: bounded, and nothing while idle (it parks, or after
// a call from another process sleeps where that process's next call wakes it: kSleepLinger).
// Hosts on CAF's shared scheduler never linger (they would hold one of its workers).
constexpr auto kLinger = std::chrono::microseconds(50);
// A host of a share group (troupe/share_thread.hpp) looks this long after a call from another
// process, while that process's calls from others come in a burst (RemoteCadence). A driver's
// synchronous calls to a worker come one after another with the driver's own work between them (an
// RL step's: decode the rollout, score it, build the batch, ~0.1-0.5 ms), and when every thread
// of the worker slept through that gap its vCPU halted: the next call then paid the futex wake on
// the caller's side (~35 us here: the IPI goes through the hypervisor) and the wake-up on this side
// (~100 us), call after call (traced on this 2-vCPU VM, DPO's step through a worker, 2026-12-05).
// The look yields its core between looks, and stops once a call from another process runs
// anywhere in this one (RemoteCadence::running): the vCPU is busy then, and a look would take
// time slices from the call.
constexpr auto kBurstLinger = std::chrono::microseconds(1000);
// After a call from another process, a host on its own thread then sleeps this long on this
// process's lanes and its bell (HostedObject) before it parks on its mailbox: the next call by a
// lane wakes it directly, where a parked host's costs two wake-ups (the io thread's, which the
// caller's doorbell wakes, then the host's, which the io thread's post wakes), ~50-100 us each on
// a small VM. Whatever posts to the host rings its bell; anything else that reaches its mailbox
// (none of troupe's) waits this long at most. A sleeping thread costs nothing, and one frame wakes
// one sleeper of a process (lane::Producer::put): long enough for the calls of a pipeline's
// stages, which come every few tens of milliseconds.
constexpr auto kSleepLinger = std::chrono::seconds(1);

// Of a host's calls from this process, a method's first and then one in this many are timed, to
// find its long methods (kLocalExpectFrom, actor_cell.hpp); a method found long is timed on every
// call. Rarely: the clock reads cost short methods' back-to-back calls (README, actor calls).
constexpr std::uint32_t kTimeOneIn = 1024;

struct HostState {
  std::shared_ptr<HostedObject> hosted;
  bool linger = false;   // on a thread of its own (detached)
  // The methods its calls from this process ran, each with whether one of its timed runs was long.
  std::vector<std::pair<std::string, bool>> methods;
  std::uint32_t local_calls = 0;
  // `method`'s entry when this call of it is to be timed (kTimeOneIn), else null.
  std::pair<std::string, bool>* timed(const std::string& method) {
    auto m = std::find_if(methods.begin(), methods.end(), [&](const auto& x) { return x.first == method; });
    const bool first = m == methods.end();
    if (first) m = methods.insert(methods.end(), {method, false});
    return first || m->second || ++local_calls % kTimeOneIn == 0 ? &*m : nullptr;
  }
  HostState() = default;
  HostState(const HostState&) = delete;
  ~HostState() {   // on the host's thread, at its exit (after any call a caller is running on its own thread)
    if (!hosted) return;
    std::lock_guard lk(hosted->running);
    for (auto& f : hosted->pending) f.state()->fail(Error{ErrorCode::ActorDied, hosted->label + " stopped before it answered"});
    hosted->pending.clear();
    if (hosted->object != nullptr) hosted->type->destroy(hosted->object);
    hosted->object = nullptr;
  }
};

using Host = caf::stateful_actor<HostState>;

// This process's calls from other processes, as its hosts answer them: how many run now, and
// whether the last few came within kBurstLinger of the answer before them (a burst, such as an RL
// driver's step). Process-wide: the call after an answer is often another host's (a worker's
// colocated roles), and whichever thread looks takes it. Kept only once a host of the process has
// joined a share group (its only readers): other processes' calls pay one relaxed load for it.
class RemoteCadence {
 public:
  static RemoteCadence& instance() {
    static RemoteCadence c;
    return c;
  }
  void track() { tracking_.store(true, std::memory_order_relaxed); }   // a host joined a share group
  // A call from another process begins: whether end() is to follow.
  bool begin() {
    if (!tracking_.load(std::memory_order_relaxed)) return false;
    running_.fetch_add(1);
    const std::int64_t last = answered_.load(std::memory_order_relaxed);
    if (last == 0) return true;
    const bool soon = now_ns() - last < std::chrono::nanoseconds(kBurstLinger).count();
    // One bit a call, the newest lowest. Two hosts beginning at once may lose one's bit: a hint.
    const std::uint32_t h = history_.load(std::memory_order_relaxed);
    history_.store(((h << 1) | (soon ? 1u : 0u)) & kWindowMask, std::memory_order_relaxed);
    return true;
  }
  void end() {   // ...and has been answered
    answered_.store(now_ns(), std::memory_order_relaxed);
    running_.fetch_sub(1);
  }
  // Half or more of the last kWindow calls came within kBurstLinger of the answer before them.
  bool bursty() const { return std::popcount(history_.load(std::memory_order_relaxed)) * 2 >= kWindow; }
  bool running() const { return running_.load(std::memory_order_relaxed) > 0; }

 private:
  static constexpr int kWindow = 8;
  static constexpr std::uint32_t kWindowMask = (1u << kWindow) - 1;
  static std::int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }
  std::atomic<bool> tracking_{false};
  std::atomic<int> running_{0};
  std::atomic<std::int64_t> answered_{0};
  std::atomic<std::uint32_t> history_{0};
};

// A call from another process for a host of this thread's share group, taken as this thread
// looked for its own host's next call (LocalRoute::deliver): its host's `running` is held
// (LocalRoute::try_claim) until it has run here (run_taken).
struct Taken {
  std::shared_ptr<HostedObject> hosted;
  std::shared_ptr<ActorCell> cell;
  ChannelCall call;
};
// The host whose thread this is, while it looks for its next call from another process (linger):
// what it drains for another host of its share group, idle, it takes (tl_taken) rather than post.
thread_local HostedObject* tl_looking = nullptr;
thread_local std::optional<Taken> tl_taken;
// The host whose thread this is, while it runs a call taken for another host (run_taken): a call
// to it from here would wait for this very thread (ActorCell::submit runs it here when it can).
thread_local HostedObject* tl_lent = nullptr;

void answer_remote(HostedObject& h, ActorCell& cell, WireCall& wc, const std::shared_ptr<ReplySink>& sink, Host* self);

// Runs the call taken for another host, if there is one, on this thread, `own`'s, with no lane
// watch of linger's alive (a watch that does not drain holds its lanes' messages up). Whether it did.
bool run_taken(HostedObject& own) {
  if (!tl_taken) return false;
  Taken t = std::move(*tl_taken);
  tl_taken.reset();
  struct Lent {   // what this thread drains while the method runs (a reply it waits for) is posted
    HostedObject& own;
    explicit Lent(HostedObject& o) : own(o) {
      tl_lent = &own;
      own.lent.store(true);
    }
    ~Lent() {
      own.lent.store(false);
      tl_lent = nullptr;
    }
  } lent(own);
  std::lock_guard running(t.hosted->running, std::adopt_lock);
  answer_remote(*t.hosted, *t.cell, t.call.call, t.call.sink, nullptr);
  return true;
}

// After a call: looks for the next message for kLinger (then, after a call from another process,
// sleeps for it up to kSleepLinger) before returning to CAF, which parks the thread once the
// mailbox is empty. Any message ends it (a call, an exit), and CAF takes it next.
// After a call from this process the host only pauses between looks: its caller, on another core,
// usually sends the next call within a microsecond or two, and a thread that yielded its core to
// another process's thread would lose the wake-up preemption a parked one gets, so that a call
// arriving meanwhile waited for that thread's time slice (measured beside a busy loop: 0.4 x the
// calls). After a call from another process the host yields its core between looks (a link io
// thread may need it) and takes what arrives in this process's lanes itself: the next call,
// published there by its caller, then reaches the mailbox with no io thread woken.
void linger(Host* self, bool remote) {
  if (!self->state.linger) return;
  const auto now = std::chrono::steady_clock::now();
  if (remote) {   // the next call may come by a lane: this thread takes it there itself
    HostedObject& h = *self->state.hosted;
    const RemoteCadence& cadence = RemoteCadence::instance();
    const bool shares = h.share_group.load(std::memory_order_relaxed) != 0;
    for (auto start = now;;) {   // again after each call this thread ran for another host
      {
        net::LaneWatch watch;
        // Declared after the watch, so it ends first: the watch's last drain, as it ends, posts
        // what it takes rather than take it for this thread.
        struct Looking {   // this thread takes calls for its share group's idle hosts while it looks
          explicit Looking(HostedObject* h) { tl_looking = h; }
          ~Looking() { tl_looking = nullptr; }
        } looking(&h);
        const auto look_until = start + (shares && cadence.bursty() ? kBurstLinger : kLinger);
        while (!tl_taken && self->mailbox().empty() && std::chrono::steady_clock::now() < look_until &&
               !(shares && cadence.running())) {
          if (watch.drain() == 0) std::this_thread::yield();
        }
        const auto sleep_until = start + kSleepLinger;
        while (!tl_taken && self->mailbox().empty() && std::chrono::steady_clock::now() < sleep_until) {
          // seq_cst with a poster's bell and `sleeping` (HostedObject::ring): it wakes this sleep,
          // or the look at the mailbox after reading the bell sees its message.
          h.sleeping.store(true);
          const std::uint32_t seen = h.bell.load();
          if (!self->mailbox().empty() || !watch.sleep(h.bell, seen, sleep_until, h.remote_id.load(std::memory_order_relaxed))) break;
          h.sleeping.store(false);   // awake: what this thread posts to itself as it drains rings no one
          watch.drain();
        }
        h.sleeping.store(false);
      }
      if (!run_taken(h) || !self->mailbox().empty()) return;
      start = std::chrono::steady_clock::now();
    }
  }
  const auto until = now + kLinger;
  for (unsigned i = 0; self->mailbox().empty(); ++i) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
    if (i % 16 == 15 && std::chrono::steady_clock::now() >= until) return;
  }
}

std::string describe_current_exception() {
  try {
    throw;
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "a non-standard exception";
  }
}

// Runs `method` on the object, `h.running` held: the reply payload, or the error it failed with. A
// method that answers later (it returned a Future) sets `*later` to its encoded result's future
// instead (`crossing`: that result goes to another process), and the Payload returned means nothing.
Result<Payload> invoke(HostedObject& h, const std::string& method, const Payload& args, bool crossing,
                       Future<Payload>* later) {
  const ActorTypeInfo& type = *h.type;
  if (method == kBarrierMethod) return Payload{};
  if (method == kShareThreadMethod) {   // troupe::share_thread
    try {
      const std::uint64_t group = std::get<0>(decode_args<std::uint64_t>(args));
      h.share_group.store(group, std::memory_order_relaxed);
      if (group != 0) RemoteCadence::instance().track();
    } catch (const DecodeError& e) {
      return Error{ErrorCode::BadArguments, std::string(kShareThreadMethod) + ": " + e.error().message};
    }
    return Payload{};
  }
  const MethodInfo* m = type.find_method(method);
  if (m == nullptr) return Error{ErrorCode::BadArguments, "no method '" + method + "' on " + type.name};
  try {
    if (m->invoke_deferred) {
      *later = m->invoke_deferred(h.object, args, crossing);
      std::erase_if(h.pending, [](const Future<Payload>& p) { return p.ready(); });
      h.pending.push_back(*later);
      return Payload{};
    }
    return m->invoke(h.object, args);
  } catch (const DecodeError& e) {
    return Error{ErrorCode::BadArguments, "arguments of " + type.name + "." + method + ": " + e.error().message};
  } catch (const CallError& e) {   // a call the method made failed: not this actor's own error
    return Error{ErrorCode::MethodFailed, h.label + "." + method + " threw: " + e.what()};
  } catch (const ErrorException& e) {   // the method's own error, passed on exactly
    return e.error();
  } catch (...) {
    return Error{ErrorCode::MethodFailed, h.label + "." + method + " threw: " + describe_current_exception()};
  }
}

// A call from this process, `h.running` held, on the host's thread or its caller's. Returns its
// outcome, for finish_local once the caller has let go of `running` (a waiter that sees the result
// may call again at once and find the actor free; the call stays in the cell's list until then, so
// no later call overtakes it); none when there is nothing to complete now (killed while queued, or
// answered later, when the method's future completes).
std::optional<Result<Payload>> run_local(HostedObject& h, const std::shared_ptr<ActorCell>& cell, const std::string& method,
                                         const Payload& args, const std::shared_ptr<StateBase>& call) {
  if (cell->dead()) return std::nullopt;   // killed while queued: its future has failed already
  Future<Payload> later;
  auto r = invoke(h, method, args, false, &later);
  if (later.valid()) {   // answered on the thread completing the method's future
    auto* st = later.state().get();   // alive while it runs its callbacks
    st->on_ready([cell, call, st] {
      if (st->has_error()) cell->fail_call(*call, st->error()); else cell->complete(*call, st->value());
    });
    return std::nullopt;
  }
  return r;
}

// `method` ran `ran` long on the host's thread when timed (HostState::timed); zero: not timed.
void finish_local(ActorCell& cell, StateBase& call, const std::optional<Result<Payload>>& outcome, const char* method = nullptr,
                  std::chrono::nanoseconds ran = std::chrono::nanoseconds::zero()) {
  if (!outcome) return;
  if (outcome->ok()) cell.complete(call, outcome->value(), method, ran); else cell.fail_call(call, outcome->error());
}

// Fills `reply` with a result for another process (its tensors exposed for the caller to pull).
void set_result(WireReply& reply, Payload& result, std::size_t inline_max) {
  try {
    WirePayload out = to_wire(result, inline_max);
    reply.result = std::move(out.bytes);
    reply.tensors = std::move(out.tensors);
  } catch (const ErrorException& e) {
    reply.set_error(e.error());
  } catch (const std::exception& e) {
    reply.set_error(Error{ErrorCode::Internal, std::string("could not send the result: ") + e.what()});
  }
}

// A call from another process, answered on `sink`, `h.running` held: on its host's thread `self`,
// or (null) on the thread of another host of its share group that took it (run_taken). Its token
// is checked here too (a call server fills in the one its connection presented): hosts outside
// worker processes take none (SEC-1).
void answer_remote(HostedObject& h, ActorCell& cell, WireCall& wc, const std::shared_ptr<ReplySink>& sink, Host* self) {
  struct Answered {
    RemoteCadence& c;
    bool tracked;
    ~Answered() {
      if (tracked) c.end();
    }
  } answered{RemoteCadence::instance(), RemoteCadence::instance().begin()};
  WireReply reply;
  reply.actor_id = wc.actor_id;
  reply.incarnation = wc.incarnation;
  reply.seq = wc.seq;
  const auto& ctx = h.ctx;
  // A worker's hosts know the token; an in-process actor of another process serves calls from
  // outside only once exported (ActorCell::serve_remote), and with that token.
  const ActorCell::Served served = ctx.token.empty() ? cell.served() : ActorCell::Served{ctx.token, ctx.incarnation};
  bool more = false;
  if (served.token.empty() || !net::token_matches(wc.token, served.token)) {
    reply.set_error(Error{ErrorCode::Unavailable, "refused: missing or wrong cluster token"});
  } else if (wc.incarnation != served.incarnation) {   // FT-2
    reply.set_error(Error{ErrorCode::ActorDied, cell.label() + " incarnation " + std::to_string(wc.incarnation) + " is gone"});
  } else if (cell.dead()) {
    reply.set_error(Error{ErrorCode::ActorDied, cell.label() + " stopped"});
  } else {
    try {
      Payload args = from_wire(std::move(wc.args), wc.tensors, ctx.fetch_timeout);
      RemoteArgs crossing(true);   // the result goes to another process: refs in it are exported
      Future<Payload> later;
      auto r = invoke(h, wc.method, args, true, &later);
      if (later.valid()) {   // sent when the method's future completes, from the thread completing it
        auto* st = later.state().get();   // alive while it runs its callbacks
        st->on_ready([reply = std::move(reply), sink, st]() mutable {
          if (st->has_error()) reply.set_error(st->error()); else set_result(reply, st->value(), sink->inline_max());
          sink->reply(reply, false);
        });
        return;
      }
      if (r.ok()) set_result(reply, r.value(), sink->inline_max()); else reply.set_error(r.error());
      // Calls queued behind this one: its reply may wait to leave with theirs (the io thread
      // writes it within microseconds, the last one of a run goes at once).
      more = self != nullptr && !self->mailbox().empty();
    } catch (const DecodeError& e) {
      reply.set_error(Error{ErrorCode::BadArguments, "arguments: " + e.error().message});
    } catch (const ErrorException& e) {   // its tensor arguments could not be fetched
      reply.set_error(e.error());
    } catch (const std::exception& e) {
      reply.set_error(Error{ErrorCode::Internal, std::string("could not take the call: ") + e.what()});
    }
  }
  sink->reply(reply, more);
}

// A call from another process that reached the host's mailbox (LocalRoute::deliver).
void run_remote(Host* self, ActorCell& cell, WireCall& wc, const std::shared_ptr<ReplySink>& sink) {
  HostedObject& h = *self->state.hosted;
  std::lock_guard running(h.running);
  h.posted.fetch_sub(1, std::memory_order_relaxed);
  answer_remote(h, cell, wc, sink, self);
}

caf::behavior host(Host* self, std::shared_ptr<ActorCell> cell, std::shared_ptr<HostedObject> hosted, Factory factory,
                   Payload ctor_args, bool lingers) {
  self->state.hosted = hosted;
  self->state.linger = lingers;
  // Whatever stops the host (kill, shutdown, constructor failure), no call may wait on it.
  self->attach_functor([cell](const caf::error&) { cell->mark_dead("stopped"); });
  try {
    void* object = factory(ctor_args);
    std::lock_guard lk(hosted->running);
    hosted->object = object;
  } catch (...) {
    cell->mark_dead("died: its constructor threw: " + describe_current_exception());
    self->quit();
    return {};
  }
  cell->set_ready();
  return {
      [self, cell](const CallMsg& m) {
        HostedObject& h = *self->state.hosted;
        std::optional<Result<Payload>> outcome;
        std::chrono::nanoseconds ran{0};
        {
          std::lock_guard running(h.running);
          h.posted.fetch_sub(1, std::memory_order_relaxed);
          auto* timed = self->state.timed(m.method);   // valid until the next call's lookup
          const auto start = timed ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
          outcome = run_local(h, cell, m.method, m.args, m.call);
          if (timed) {
            ran = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start);
            timed->second = timed->second || ran >= kLocalExpectFrom;
          }
        }
        finish_local(*cell, *m.call, outcome, m.method.c_str(), ran);
        linger(self, false);
      },
      [self, cell](ChannelCall& cc) {
        run_remote(self, *cell, cc.call, cc.sink);
        linger(self, true);
      },
  };
}

}  // namespace

std::shared_ptr<LocalRoute> spawn_host(caf::actor_system& sys, bool detached, std::shared_ptr<ActorCell> cell,
                                       const ActorTypeInfo& type, Factory factory, Payload ctor_args, HostContext ctx) {
  std::weak_ptr<ActorCell> weak = cell;
  auto hosted = std::make_shared<HostedObject>();
  hosted->type = &type;
  hosted->ctx = std::move(ctx);
  hosted->label = cell->label();
  caf::actor actor = detached ? sys.spawn<caf::detached>(host, std::move(cell), hosted, factory, std::move(ctor_args), true)
                              : sys.spawn(host, std::move(cell), hosted, factory, std::move(ctor_args), false);
  return std::make_shared<LocalRoute>(std::move(actor), std::move(hosted), std::move(weak));
}

Sent LocalRoute::send(Attempt&& a) {
  post(a.method, std::move(a.args), std::move(a.state));
  return Sent{this, {}, {}};
}

void HostedObject::ring() {
  bell.fetch_add(1);
  if (sleeping.load()) net::wake_word(bell);
}

void LocalRoute::post(const char* method, Payload&& args, std::shared_ptr<StateBase>&& state) {
  hosted_->posted.fetch_add(1, std::memory_order_relaxed);
  caf::anon_send(host_, CallMsg{std::move(state), method, std::move(args)});
  hosted_->ring();
}

void LocalRoute::deliver(ChannelCall&& call) {
  // Drained by the thread of another host of this one's share group as it looked for its next
  // call: taken, to run on that thread (linger, run_taken), if this host is idle and its own
  // thread is not lent out itself (its calls then wait for it, as on one thread).
  if (const HostedObject* looking = tl_looking;
      looking != nullptr && looking != hosted_.get() && !tl_taken && !hosted_->lent.load()) {
    const std::uint64_t group = hosted_->share_group.load(std::memory_order_relaxed);
    if (group != 0 && group == looking->share_group.load(std::memory_order_relaxed)) {
      if (auto cell = cell_.lock(); cell && try_claim()) {
        tl_taken.emplace(Taken{hosted_, std::move(cell), std::move(call)});
        return;
      }
    }
  }
  hosted_->posted.fetch_add(1, std::memory_order_relaxed);
  caf::anon_send(host_, std::move(call));
  hosted_->ring();
}

bool LocalRoute::lent_to_this_thread() const { return tl_lent == hosted_.get(); }

bool LocalRoute::try_claim() {
  // A call runs, or one waits in the mailbox: the caller's goes to the mailbox behind it.
  if (hosted_->posted.load(std::memory_order_relaxed) != 0 || !hosted_->running.try_lock()) return false;
  // Posts happen outside the cell's lock: look again now that the host cannot begin one.
  if (hosted_->object != nullptr && hosted_->posted.load(std::memory_order_relaxed) == 0) return true;
  hosted_->running.unlock();   // not constructed yet, destroyed, or a call was posted meanwhile
  return false;
}

void LocalRoute::run_claimed(const std::shared_ptr<ActorCell>& cell, const char* method, const Payload& args,
                             const std::shared_ptr<StateBase>& state) {
  std::optional<Result<Payload>> outcome;
  {
    std::lock_guard running(hosted_->running, std::adopt_lock);
    RemoteArgs crossing(false);   // the caller may be running a call from another process: this one is local
    outcome = run_local(*hosted_, cell, method, args, state);
  }
  finish_local(*cell, *state, outcome);
}

void LocalRoute::stop() {
  caf::anon_send_exit(host_, caf::exit_reason::kill);
  hosted_->ring();
}

}  // namespace troupe::detail
