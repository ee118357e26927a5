#include <algorithm>
#include <chrono>
#include <memory>

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

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// A remote reply's first kYieldFor (or until `deadline`): this thread takes the messages of this
// process's lanes itself (the reply among them), so that no io thread has to wake and hand the
// reply over; else it gives its core to that io thread between looks. Whether `s` is ready.
// It first writes out this process's batched link messages: the call it waits for may be one of
// them (net::Link::Send::Batched); one atomic load when none waits. (A wait for a local state
// leaves them to the io thread or their sender: microseconds.)
bool look_for_remote_reply(const StateBase& s, std::chrono::steady_clock::time_point deadline) {
  net::flush_batched();
  const auto until = std::min(deadline, std::chrono::steady_clock::now() + kYieldFor);
  return net::watch_lanes_until([&] { return s.ready(); }, until);
}

}  // namespace

void StateBase::wait() {
  if (ready()) return;
  if (remote_.load(std::memory_order_relaxed)) {
    if (look_for_remote_reply(*this, std::chrono::steady_clock::time_point::max())) return;
  } else {
    for (int i = 0; i < kSpinIterations; ++i) {
      if (ready()) return;
      cpu_relax();
    }
  }
  std::unique_lock lk(mu_);
  ++waiters_;
  cv_.wait(lk, [&] { return ready(); });
  --waiters_;
}

bool StateBase::wait_until(std::chrono::steady_clock::time_point deadline) {
  if (ready()) return true;
  if (remote_.load(std::memory_order_relaxed) && look_for_remote_reply(*this, deadline)) return true;
  std::unique_lock lk(mu_);
  ++waiters_;
  bool ok = cv_.wait_until(lk, deadline, [&] { return ready(); });
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
  bool wake;
  {
    std::lock_guard lk(mu_);
    status_.store(status, std::memory_order_release);
    cbs.swap(callbacks_);
    wake = waiters_ > 0;
  }
  if (wake) cv_.notify_all();
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
