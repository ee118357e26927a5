// Actor types the integration tests run in worker processes. Every worker is this test binary,
// so these registrations exist in the driver and in every worker alike.
#pragma once

#include <sys/resource.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "../support/gate_actor.hpp"   // relative: bench/ includes this header too
#include "troupe/troupe.hpp"

inline std::uint64_t fnv1a(const void* data, std::size_t n) {
  auto* p = static_cast<const unsigned char*>(data);
  std::uint64_t h = 1469598103934665603ull;
  for (std::size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

struct Store {
  int value = 0;
  explicit Store(int v) : value(v) {}
  int pid() { return int(::getpid()); }
  int tid() { return int(::gettid()); }   // the thread this call runs on
  int add(int k) { return value += k; }
  int get() { return value; }
  void sleep_ms(int ms) { ::usleep(useconds_t(ms) * 1000); }
  // A tensor of `bytes` bytes with a pattern seeded by `seed`.
  troupe::TensorView make(std::int64_t bytes, int seed) {
    auto t = troupe::TensorView::empty(troupe::DType::U8, {bytes});
    auto* p = t.data_as<std::uint8_t>();
    std::uint32_t x = std::uint32_t(seed) * 2654435761u + 1;
    for (std::int64_t i = 0; i < bytes; ++i) { x = x * 1664525u + 1013904223u; p[i] = std::uint8_t(x >> 24); }
    last_checksum = fnv1a(p, std::size_t(bytes));
    return t;
  }
  std::uint64_t checksum_of_last() { return last_checksum; }
  std::uint64_t checksum(troupe::TensorView t) { return fnv1a(t.data, t.nbytes()); }
  // Calls another actor from inside this one (actor-to-actor across processes).
  int add_via(troupe::ActorRef<Store> other, int k) { return other.call(&Store::add, k).get(); }
  // add_via, returning {the thread this call ran on, the sum}.
  std::vector<int> add_via_tid(troupe::ActorRef<Store> other, int k) {
    const int sum = other.call(&Store::add, k).get();
    return {int(::gettid()), sum};
  }
  // Pulls a tensor from another actor and checksums it here.
  std::uint64_t pull_checksum(troupe::ActorRef<Store> other, std::int64_t bytes, int seed) {
    auto t = other.call(&Store::make, bytes, seed).get();
    return fnv1a(t.data, t.nbytes());
  }
  // Allocates `mib` blocks of 1 MiB on this actor's thread, writes every page, frees them all;
  // `rounds` times. Returns the page faults of the last round (this thread's).
  long refault(int mib, int rounds) {
    long faults = 0;
    for (int r = 0; r < rounds; ++r) {
      rusage before{}, after{};
      ::getrusage(RUSAGE_THREAD, &before);
      std::vector<void*> blocks;
      blocks.reserve(std::size_t(mib));
      for (int i = 0; i < mib; ++i) {
        void* p = std::malloc(std::size_t(1) << 20);
        std::memset(p, r + 1, std::size_t(1) << 20);
        asm volatile("" : : "r"(p) : "memory");   // the writes are the point: keep them
        blocks.push_back(p);
      }
      for (void* p : blocks) std::free(p);
      ::getrusage(RUSAGE_THREAD, &after);
      faults = after.ru_minflt - before.ru_minflt;
    }
    return faults;
  }
  // Fails with an Error of another domain than the core's: its caller sees exactly that Error.
  int refuse(std::string why) { throw troupe::ErrorException(troupe::Error{troupe::WeightCode::Checksum, why}); }
  std::uint64_t last_checksum = 0;
};
TROUPE_ACTOR(Store, pid, tid, add, get, sleep_ms, make, checksum_of_last, checksum, add_via, add_via_tid, pull_checksum, refault, refuse);
