// The CAF actor that owns one user object and runs its calls, one at a time, in order.
#pragma once

#include <memory>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include "actor_cell.hpp"
#include "troupe/registry.hpp"

namespace troupe::detail {

// Spawns the host. The constructor runs first, on the host's own thread when `detached`; if it
// throws, the cell is marked dead with the exception's message and the host stops.
caf::actor spawn_host(caf::actor_system& sys, bool detached, std::shared_ptr<ActorCell> cell,
                      const ActorTypeInfo& type, Factory factory, Payload ctor_args);

}  // namespace troupe::detail
