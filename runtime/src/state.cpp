#include <algorithm>
#include <chrono>
#include <memory>
#include <thread>

#include "troupe/future.hpp"
#include "troupe/net/link.hpp"

namespace troupe::detail {
namespace {

// A reply often arrives within microseconds; looking for it that long before sleeping saves two
// context switches per synchronous call. Bounded, so an idle waiter costs nothing. An in-process
// reply is looked for with pauses; one from another process with sched_yield between looks, since
// the thread that brings it (this process's link io thread, when it does not come by a lane this
// waiter drains) may need this very core: on a 2-vCPU VM a waiter that only pauses holds it off
// for the whole spin.
constexpr int kSpinIterations = 1000;
constexpr auto kYieldFor = std::chrono::microseconds(50);

// Around a reply's expected time (await_remote, and wait_until for a reply from this process) the
// waiter looks from this long before it (and a twentieth of the time the call was expected to take,
// up to kSpreadOf's: its spread) until this long after (and a tenth): at most 1.2 ms before and
// 2.2 ms after.
constexpr auto kLead = std::chrono::microseconds(200);
constexpr auto kSpreadOf = std::chrono::milliseconds(20);

// When to look for a reply expected at `expected_ns` (StateBase::expect_reply), seen at `now`.
struct LookWindow {
  std::chrono::steady_clock::time_point from, until;
};
LookWindow look_window(std::chrono::steady_clock::rep expected_ns, std::chrono::steady_clock::time_point now) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point at{Clock::duration(expected_ns)};
  const auto ahead = std::min<Clock::duration>(at > now ? at - now : Clock::duration::zero(), kSpreadOf);
  return LookWindow{at - kLead - ahead / 20, at + kLead + ahead / 10};
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

}  // namespace

// A remote reply: this thread takes the messages of this process's lanes itself (the reply among
// them), so that no io thread has to wake and hand the reply over. For the first kYieldFor it
// looks, giving its core to whoever needs it between looks; then it sleeps on the lanes and on
// bell_ until `deadline` (LaneWatch::sleep): a reply by a lane wakes it there, one by the socket or
// another thread (the io thread, a tensor fetcher) completes the state, which wakes it
// (finish_complete). Waking a sleeping thread costs ~50-150 us on a small VM (more when its vCPU
// halted meanwhile), so when the call table expects the reply at a time (expect_reply: the
// method's recent calls) the thread sleeps only until shortly before it and looks from there, for
// at most a little longer than expected, then sleeps again: it burns a core for the window's
// length (kLead and a share of the call's time, each side) to save the wake-up.
// It first writes out this process's batched link messages: the call it waits for may be one of
// them (net::Link::Send::Batched); one atomic load when none waits. (A wait for a local state
// leaves them to the io thread or their sender: microseconds.) Whether the state is ready; false
// also when the lanes cannot be slept on (the caller then waits on cv_).
bool StateBase::await_remote(std::chrono::steady_clock::time_point deadline) {
  using Clock = std::chrono::steady_clock;
  net::flush_batched();
  net::LaneWatch watch;
  const auto look = [&](Clock::time_point until) {   // whether the state is ready by `until`
    while (!ready()) {
      if (Clock::now() >= until) return false;
      if (watch.drain() == 0) std::this_thread::yield();
    }
    return true;
  };
  const auto start = Clock::now();
  if (look(std::min(deadline, start + kYieldFor))) return true;
  auto look_from = Clock::time_point::max(), look_until = Clock::time_point::min();
  if (const auto ns = expected_ns_.load(std::memory_order_relaxed); ns != 0) {
    const LookWindow w = look_window(ns, start);
    look_from = w.from;
    look_until = w.until;
  }
  while (!ready()) {
    const auto now = Clock::now();
    if (now >= deadline) break;
    if (now >= look_from && now < look_until) {
      if (look(std::min(deadline, look_until))) return true;
      continue;
    }
    std::uint32_t seen;
    {
      std::lock_guard lk(mu_);
      if (ready()) return true;
      ++lane_sleepers_;
      seen = bell_.load();
    }
    const bool slept = watch.sleep(bell_, seen, now < look_from ? std::min(deadline, look_from) : deadline);
    {
      std::lock_guard lk(mu_);
      --lane_sleepers_;
    }
    if (!slept) return ready();
    watch.drain();
  }
  return ready();
}

void StateBase::wait() {
  if (ready()) return;
  if (!remote_.load(std::memory_order_relaxed)) {   // a remote reply is looked for in wait_until (await_remote)
    for (int i = 0; i < kSpinIterations; ++i) {
      if (ready()) return;
      cpu_relax();
    }
  }
  wait_until(std::chrono::steady_clock::time_point::max());
}

// A reply from this process that its call table expects at a time (a long method's recent runs on
// its host, ActorCell::submit): the waiter sleeps on cv_ until shortly before it and then looks, with
// pauses, until a little after it (the window await_remote uses), so that the host completing the
// call finds no sleeper to wake (~40-80 us on a small VM; build/bench/actor_calls:
// call_overhead_10ms_us). Then, or with no expected time, it sleeps on cv_ until `deadline`
// (time_point::max(): until the state is ready, as wait() asks).
bool StateBase::wait_until(std::chrono::steady_clock::time_point deadline) {
  using Clock = std::chrono::steady_clock;
  if (ready()) return true;
  if (remote_.load(std::memory_order_relaxed)) {
    if (await_remote(deadline)) return true;
  } else if (const auto ns = expected_ns_.load(std::memory_order_relaxed); ns != 0) {
    const auto now = Clock::now();
    const LookWindow w = look_window(ns, now);
    if (now < w.from) {
      std::unique_lock lk(mu_);
      ++waiters_;
      cv_.wait_until(lk, std::min(deadline, w.from), [&] { return ready(); });
      --waiters_;
    }
    while (!ready() && Clock::now() < std::min(deadline, w.until)) {
      for (int i = 0; i < 16 && !ready(); ++i) cpu_relax();
    }
    if (ready()) return true;
  }
  std::unique_lock lk(mu_);
  ++waiters_;
  bool ok = true;
  if (deadline == Clock::time_point::max()) cv_.wait(lk, [&] { return ready(); });
  else ok = cv_.wait_until(lk, deadline, [&] { return ready(); });
  --waiters_;
  return ok;
}

bool StateBase::fail(Error e) {
  if (!begin_complete()) return false;
  error_ = std::move(e);
  finish_complete(kError);
  return true;
}

void StateBase::finish_complete(int status) {
  std::vector<std::function<void()>> cbs;
  bool wake, ring;
  {
    std::lock_guard lk(mu_);
    status_.store(status, std::memory_order_release);
    cbs.swap(callbacks_);
    wake = waiters_ > 0;
    ring = lane_sleepers_ > 0;
  }
  if (wake) cv_.notify_all();
  if (ring) {
    bell_.fetch_add(1);
    net::wake_word(bell_);
  }
  for (auto& cb : cbs) cb();
}

void StateBase::on_ready(std::function<void()> cb) {
  {
    std::lock_guard lk(mu_);
    if (!ready()) { callbacks_.push_back(std::move(cb)); return; }
  }
  cb();
}

std::size_t wait_any_state(const std::vector<StateBase*>& states) {
  if (states.empty()) return 0;
  for (std::size_t i = 0; i < states.size(); ++i) if (states[i]->ready()) return i;
  net::flush_batched();   // whichever of them is a remote call's, it may be batched still
  struct Latch {
    std::mutex mu;
    std::condition_variable cv;
    bool fired = false;
  };
  auto latch = std::make_shared<Latch>();
  for (auto* s : states) {
    s->on_ready([latch] {
      { std::lock_guard lk(latch->mu); latch->fired = true; }
      latch->cv.notify_all();
    });
  }
  std::unique_lock lk(latch->mu);
  latch->cv.wait(lk, [&] { return latch->fired; });
  for (std::size_t i = 0; i < states.size(); ++i) if (states[i]->ready()) return i;
  return 0;   // unreachable: the latch fires only after a state completed
}

}  // namespace troupe::detail
