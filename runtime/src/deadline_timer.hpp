// One thread that fails calls whose deadline has passed. A call schedules itself when it is
// sent with a deadline and cancels itself when it completes first.
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

class DeadlineTimer {
 public:
  using Clock = std::chrono::steady_clock;
  using Key = std::pair<Clock::time_point, std::uint64_t>;

  DeadlineTimer();
  ~DeadlineTimer();   // stop()
  DeadlineTimer(const DeadlineTimer&) = delete;
  DeadlineTimer& operator=(const DeadlineTimer&) = delete;

  // Runs `fire` on the timer thread at `when` unless cancelled first. Returns the cancel key.
  Key schedule(Clock::time_point when, std::function<void()> fire);
  void cancel(const Key& key);
  // Drops every pending entry without firing and joins the thread. Idempotent.
  void stop();

 private:
  void run();

  std::mutex mu_;
  std::condition_variable cv_;
  std::map<Key, std::function<void()>> entries_;
  std::uint64_t next_token_ = 1;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace troupe::detail
