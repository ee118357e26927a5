// Deadlines. A call schedules itself when it is sent with a deadline and cancels itself when it
// completes first. Timer is the interface the call table uses (tests drive a manual one, with no
// thread and no sleep); DeadlineTimer fires on one thread of its own.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <utility>

namespace troupe::detail {

class Timer {
 public:
  using Clock = std::chrono::steady_clock;
  using Key = std::pair<Clock::time_point, std::uint64_t>;

  virtual ~Timer() = default;
  // Runs `fire` at `when` unless cancelled first. Returns the cancel key. Thread-safe.
  virtual Key schedule(Clock::time_point when, std::function<void()> fire) = 0;
  virtual void cancel(const Key& key) = 0;
};

class DeadlineTimer final : public Timer {
 public:
  DeadlineTimer();
  ~DeadlineTimer();   // stop()
  DeadlineTimer(const DeadlineTimer&) = delete;
  DeadlineTimer& operator=(const DeadlineTimer&) = delete;

  // `fire` runs on the timer thread.
  Key schedule(Clock::time_point when, std::function<void()> fire) override;
  void cancel(const Key& key) override;
  // Drops every pending entry without firing and joins the thread. Idempotent.
  void stop();

 private:
  void run();

  std::mutex mu_;
  std::condition_variable cv_;
  std::map<Key, std::function<void()>> entries_;
  // What the thread sleeps until: max while it waits with no entry, min while it is not asleep (it
  // looks at the entries before it sleeps again). A new entry wakes it only if due before that:
  // a call's deadline, scheduled as the previous call's is cancelled, wakes no thread.
  Clock::time_point armed_ = Clock::time_point::min();
  std::uint64_t next_token_ = 1;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace troupe::detail
