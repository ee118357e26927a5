// Actor ids. One table per process holds the actors it hosts and the remote ones it calls, so the
// two id spaces never meet: in-process actors count up from 1, cluster actors (numbered by the
// head) from kClusterActorBase.
#pragma once

#include <cstdint>
#include <string>

namespace troupe {

inline constexpr std::uint64_t kClusterActorBase = std::uint64_t(1) << 48;

// An actor's number as people read it: in-process actors count from 1 in their process, cluster
// actors from 1 at the head (the id less kClusterActorBase; `troupe status` shows it as LABEL).
inline std::uint64_t actor_number(std::uint64_t id) { return id >= kClusterActorBase ? id - kClusterActorBase : id; }

// How messages and logs name an actor, in-process or not: its name (or type) and number, "Counter#3".
inline std::string actor_label(const std::string& name, std::uint64_t id) {
  std::string label = name;   // appended, not name + "#" + ...: GCC 12 warns falsely on that (-Wrestrict)
  label += '#';
  label += std::to_string(actor_number(id));
  return label;
}

}  // namespace troupe
