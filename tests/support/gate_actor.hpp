// Gate: an actor whose answers wait for another call (deferred replies). wait() returns a Future
// that open(v) completes with v, refuse(why) fails, or a thread of the actor's completes later
// (open_later): the runtime answers each wait() call when its future completes. Used in-process
// (runtime tests) and in worker processes (integration tests).
#pragma once

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "troupe/troupe.hpp"

struct Gate {
  Gate() = default;
  Gate(const Gate&) = delete;
  ~Gate() {
    for (auto& t : threads) t.join();
  }
  troupe::Future<int> wait() {
    waiting.emplace_back();
    return waiting.back().future();
  }
  troupe::Future<void> wait_void() {
    waiting_void.emplace_back();
    return waiting_void.back().future();
  }
  // Completes every wait() with v (and every wait_void()); returns how many were waiting.
  int open(int v) {
    int n = int(waiting.size() + waiting_void.size());
    for (auto& p : waiting) p.set_value(v);
    for (auto& p : waiting_void) p.set_value();
    waiting.clear();
    waiting_void.clear();
    return n;
  }
  // Fails every wait() with a Cancelled error saying `why`.
  int refuse(std::string why) {
    int n = int(waiting.size());
    for (auto& p : waiting) p.set_error(troupe::Error{troupe::ErrorCode::Cancelled, why});
    waiting.clear();
    return n;
  }
  int waiters() { return int(waiting.size() + waiting_void.size()); }
  // Answered with v by another thread after `ms` milliseconds.
  troupe::Future<int> open_later(int v, int ms) {
    troupe::Promise<int> p;
    threads.emplace_back([p, v, ms] {
      std::this_thread::sleep_for(std::chrono::milliseconds(ms));
      p.set_value(v);
    });
    return p.future();
  }
  // A deferred method that throws before it returns a future: an ordinary failed call.
  troupe::Future<int> throw_now(std::string why) { throw std::runtime_error(why); }

  std::vector<troupe::Promise<int>> waiting;
  std::vector<troupe::Promise<void>> waiting_void;
  std::vector<std::thread> threads;
};
TROUPE_ACTOR(Gate, wait, wait_void, open, refuse, waiters, open_later, throw_now);
