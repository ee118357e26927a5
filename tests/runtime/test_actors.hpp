// Small actor types shared by the runtime tests.
#pragma once

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "troupe/troupe.hpp"

struct Counter {
  int n = 0;
  explicit Counter(int start = 0) : n(start) {}
  int add(int k) { return n += k; }
  int get() const { return n; }
  std::vector<int> log_calls(int k) { seen.push_back(k); return seen; }
  void sleep_ms(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }
  int fail(std::string why) { throw std::runtime_error(why); }
  std::vector<int> seen;
};

struct Broken {
  explicit Broken(std::string why) { throw std::runtime_error(why); }
  int ping() { return 1; }
};

// Counts live instances so tests can check that shutdown destroys every actor.
struct Tracked {
  static inline std::atomic<int> live{0};
  Tracked() { ++live; }
  ~Tracked() { --live; }
  Tracked(const Tracked&) = delete;
  int ping() { return 7; }
  void sleep_ms(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }
};
