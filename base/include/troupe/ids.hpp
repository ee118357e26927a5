// Actor ids. One table per process holds the actors it hosts and the remote ones it calls, so the
// two id spaces never meet: in-process actors count up from 1, cluster actors (numbered by the
// head) from kClusterActorBase.
#pragma once

#include <cstdint>

namespace troupe {

inline constexpr std::uint64_t kClusterActorBase = std::uint64_t(1) << 48;

}  // namespace troupe
