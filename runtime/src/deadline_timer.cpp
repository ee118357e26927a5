#include "deadline_timer.hpp"

namespace troupe::detail {

DeadlineTimer::DeadlineTimer() : thread_([this] { run(); }) {}

DeadlineTimer::~DeadlineTimer() { stop(); }

DeadlineTimer::Key DeadlineTimer::schedule(Clock::time_point when, std::function<void()> fire) {
  std::lock_guard lk(mu_);
  Key key{when, next_token_++};
  entries_.emplace(key, std::move(fire));
  if (when < armed_) {
    armed_ = Clock::time_point::min();   // woken: it looks again before it sleeps
    cv_.notify_one();
  }
  return key;
}

void DeadlineTimer::cancel(const Key& key) {
  std::lock_guard lk(mu_);
  entries_.erase(key);
}

void DeadlineTimer::stop() {
  {
    std::lock_guard lk(mu_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
    entries_.clear();
  }
  cv_.notify_one();
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

void DeadlineTimer::run() {
  std::unique_lock lk(mu_);
  while (!stopping_) {
    if (entries_.empty()) {
      armed_ = Clock::time_point::max();
      cv_.wait(lk);
      armed_ = Clock::time_point::min();
      continue;
    }
    auto first = entries_.begin();
    const Clock::time_point when = first->first.first;   // a copy: the entry may go while we wait
    if (Clock::now() < when) {
      // Cancelled entries are not looked for: the thread wakes at `when` and sleeps on, until the
      // earliest entry then (at most one needless wake-up per earliest deadline).
      armed_ = when;
      cv_.wait_until(lk, when);
      armed_ = Clock::time_point::min();
      continue;
    }
    auto fire = std::move(first->second);
    entries_.erase(first);
    lk.unlock();
    fire();
    lk.lock();
  }
}

}  // namespace troupe::detail
