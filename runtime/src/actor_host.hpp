// The CAF actor that owns one user object and runs its calls, one at a time, in order: local
// calls (CallMsg, tensors as views) and, in worker processes, remote ones: ChannelCall from a
// call channel (answered on it) or WireCall through the middleman (answered to the caller's router).
#pragma once

#include <chrono>
#include <memory>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include "actor_cell.hpp"
#include "troupe/registry.hpp"

namespace troupe::detail {

struct HostContext {
  caf::actor gateway;                              // set in worker processes
  std::uint64_t incarnation = 0;
  std::string token;                               // remote calls must carry it (SEC-1)
  std::chrono::milliseconds fetch_timeout{60000};  // pulling a remote call's tensor arguments
};

// Spawns the host. The constructor runs first, on the host's own thread when `detached`; if it
// throws, the cell is marked dead with the exception's message and the host stops.
caf::actor spawn_host(caf::actor_system& sys, bool detached, std::shared_ptr<ActorCell> cell,
                      const ActorTypeInfo& type, Factory factory, Payload ctor_args, HostContext ctx);

}  // namespace troupe::detail
