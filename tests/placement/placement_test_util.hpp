// Helpers shared by the placement tests.
#pragma once

#include <doctest/doctest.h>

#include <map>

#include "troupe/placement/scheduler.hpp"

namespace troupe::placement::test {

inline Resources res(std::string_view text) { return Resources::must_parse(text); }

template <class T>
Status status_of(const Result<T>& r) {
  return r.ok() ? Status{} : Status(r.error());
}
inline Status status_of(const Status& s) { return s; }
inline std::string describe(const Status& s) { return s.ok() ? "OK" : s.error().to_string(); }

// Checks a Status or Result is ok, printing its message when it is not.
#define CHECK_OK(expr)                                                   \
  do {                                                                   \
    const ::troupe::Status st_ = ::troupe::placement::test::status_of(expr); \
    INFO(::troupe::placement::test::describe(st_));                      \
    CHECK(st_.ok());                                                     \
  } while (0)
#define REQUIRE_OK(expr)                                                 \
  do {                                                                   \
    const ::troupe::Status st_ = ::troupe::placement::test::status_of(expr); \
    INFO(::troupe::placement::test::describe(st_));                      \
    REQUIRE(st_.ok());                                                   \
  } while (0)

// Every node's available resources, for before/after comparisons.
inline std::map<NodeId, Resources> availability(const Scheduler& s) {
  std::map<NodeId, Resources> out;
  for (NodeId id : s.node_ids(false)) out[id] = s.node(id)->available;
  return out;
}

inline PlacementGroupSpec spec(std::vector<Resources> bundles, Strategy strategy, bool wait = false) {
  PlacementGroupSpec s;
  s.bundles = std::move(bundles);
  s.strategy = strategy;
  s.wait_if_unplaced = wait;
  return s;
}

inline ActorRequest actor(ActorId id, std::string_view resources) {
  ActorRequest r;
  r.actor = id;
  r.resources = res(resources);
  return r;
}

}  // namespace troupe::placement::test
