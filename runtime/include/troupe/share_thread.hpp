// Actors that run each other's calls on whichever of their threads is awake: what a worker's
// colocated roles want when their caller calls them one at a time (a synchronous RL step: rollout,
// reference, train, publish, pull, each waiting for the one before), as verl's fused worker holds
// them on one thread.
//
// Each actor of a worker process has a thread of its own, and after answering a call from another
// process it looks for its next call for a while before it sleeps (runtime/src/actor_host.cpp,
// linger). When the next call is for another actor of the process, the looking thread hands it
// over, and the call waits for the other actor's thread to wake: on a small VM ~100 us, which a
// synchronous step pays on every call that changes role. Actors that share a thread skip the wait:
// a call from another process for one of them, taken by the looking thread of another of the same
// group, runs on that thread, there and then, when its actor is idle (no call of it running or
// queued, and its own thread not busy with another member's call); otherwise it is handed over as
// before. And while their process's calls from other processes come in a burst (half of the last
// 8 within 1 ms of the answer before), such an actor looks for 1 ms rather than 50 us, yielding
// its core between looks, and stops looking as soon as such a call runs in its process.
//
// What sharing gives up is what one thread gives up: a call for an actor of the group may wait
// while that actor's thread runs another member's call (its own calls still run one at a time and
// in order). So share threads between actors that are called one at a time, not between ones a
// caller keeps busy at once (an asynchronous pipeline's rollout and trainer). A call to a member
// made from a method running on that member's own thread (lent to another member's call) runs
// there and then if the member is idle, as call_sync would; if calls to it are queued already, it
// waits behind them, for this very thread: as on one thread, a method must not wait for such a
// call. Keep out of a group an actor that other processes call beside the group's calls (a weight
// store that elastic engines pull from) when members' methods call it. Actors in different
// processes, or in the caller's own, are unaffected: only calls from another process are taken
// this way. An actor started again after its process died (max_restarts) has left its group: call
// share_thread again.
#pragma once

#include <cstdint>

#include "troupe/actor_ref.hpp"

namespace troupe {

// The method name the hosts answer (actor_host.cpp): its one argument is the group, an id.
inline constexpr const char* kShareThreadMethod = "troupe.share_thread";

// Puts `first` and `rest` in one group of actors that share their threads (the group's id is
// first's). Waits until each has taken it; throws CallError if one cannot be reached.
template <class T, class... U>
void share_thread(const ActorRef<T>& first, const ActorRef<U>&... rest) {
  const std::uint64_t group = first.id();
  first.template call_by_name<void>(kShareThreadMethod, group).get();
  (rest.template call_by_name<void>(kShareThreadMethod, group).get(), ...);
}

}  // namespace troupe
