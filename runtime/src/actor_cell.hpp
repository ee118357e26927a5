// ActorCell: the caller-side record of one actor, shared by every ActorRef to it. It owns the
// actor's current CAF handle and the list of its calls in flight, so that a death, a kill or a
// deadline fails exactly the calls it concerns (FT-1), and a restart can retry them in
// submission order (the list's order).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include <caf/actor.hpp>
#include <caf/allowed_unsafe_message_type.hpp>

#include "deadline_timer.hpp"
#include "spin_lock.hpp"
#include "troupe/codec.hpp"
#include "troupe/detail/state.hpp"

namespace troupe::detail {

// One call in flight. Linked into its cell's list from submission until it completes, fails or
// times out; whoever unlinks it (under the cell's lock) completes its state.
struct PendingCall {
  std::shared_ptr<StateBase> state;
  DeadlineTimer::Key deadline{};
  bool has_deadline = false;
  // Intrusive list links, guarded by the cell's lock. `self` keeps the node alive while linked.
  PendingCall* prev = nullptr;
  PendingCall* next = nullptr;
  std::shared_ptr<PendingCall> self;
};

// The message a caller sends to an actor's host. Local only: the payload's tensors are views.
struct CallMsg {
  std::shared_ptr<PendingCall> call;
  std::string method;
  Payload args;
};

}  // namespace troupe::detail

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::detail::CallMsg)

namespace troupe::detail {

class ActorCell : public std::enable_shared_from_this<ActorCell> {
 public:
  ActorCell(std::uint64_t id, std::string type, std::string label, DeadlineTimer* timer,
            std::chrono::nanoseconds default_timeout);
  ~ActorCell();

  std::uint64_t id() const { return id_; }
  const std::string& type() const { return type_; }
  const std::string& label() const { return label_; }

  void set_handle(caf::actor handle);
  // Sends a call, or fails it at once if the actor is dead. Never throws.
  void submit(const char* method, Payload args, std::shared_ptr<StateBase> state,
              std::chrono::nanoseconds timeout);

  // Host side: the reply or failure of a call. A call already failed (killed, timed out)
  // ignores it.
  void complete(PendingCall& call, const Payload& reply);
  void fail_call(PendingCall& call, Error error);

  // Marks the actor dead and fails every call in flight with ActorDied(reason). Returns the
  // handle it held (to be stopped by the caller), or an invalid one if it was already dead.
  caf::actor mark_dead(const std::string& reason);
  bool dead() const { return dead_.load(std::memory_order_acquire); }
  std::size_t in_flight() const;

 private:
  std::shared_ptr<StateBase> take(PendingCall& call);
  void link(const std::shared_ptr<PendingCall>& call);      // lock held
  std::shared_ptr<PendingCall> unlink(PendingCall& call);   // lock held
  DeadlineTimer::Key schedule_deadline(const std::shared_ptr<PendingCall>& call, const char* method,
                                       std::chrono::nanoseconds timeout);

  const std::uint64_t id_;
  const std::string type_;
  const std::string label_;
  DeadlineTimer* const timer_;
  const std::chrono::nanoseconds default_timeout_;

  mutable SpinLock mu_;
  caf::actor handle_;
  std::atomic<bool> dead_{false};
  std::string death_reason_;
  PendingCall* head_ = nullptr;   // oldest call in flight
  PendingCall* tail_ = nullptr;
  std::size_t count_ = 0;
};

}  // namespace troupe::detail
