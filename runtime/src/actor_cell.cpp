#include "actor_cell.hpp"

#include <caf/send.hpp>

#include <mutex>
#include <vector>

#include "troupe/actor_ref.hpp"

namespace troupe::detail {

ActorCell::ActorCell(std::uint64_t id, std::string type, std::string label, DeadlineTimer* timer,
                     std::chrono::nanoseconds default_timeout)
    : id_(id), type_(std::move(type)), label_(std::move(label)), timer_(timer), default_timeout_(default_timeout) {}

ActorCell::~ActorCell() { mark_dead("was released"); }

void ActorCell::set_handle(caf::actor handle) {
  std::lock_guard lk(mu_);
  if (!dead()) handle_ = std::move(handle);   // a host that died at birth keeps no handle
}

void ActorCell::link(const std::shared_ptr<PendingCall>& call) {
  call->self = call;
  call->prev = tail_;
  if (tail_ != nullptr) tail_->next = call.get(); else head_ = call.get();
  tail_ = call.get();
  ++count_;
}

std::shared_ptr<PendingCall> ActorCell::unlink(PendingCall& call) {
  if (!call.self) return nullptr;   // not linked: already completed or failed
  if (call.prev != nullptr) call.prev->next = call.next; else head_ = call.next;
  if (call.next != nullptr) call.next->prev = call.prev; else tail_ = call.prev;
  call.prev = call.next = nullptr;
  --count_;
  return std::move(call.self);
}

void ActorCell::submit(const char* method, Payload args, std::shared_ptr<StateBase> state,
                       std::chrono::nanoseconds timeout) {
  if (timeout.count() <= 0) timeout = default_timeout_;
  auto call = std::make_shared<PendingCall>();
  call->state = std::move(state);
  caf::actor dest;
  std::string dead_reason;
  bool sent = false;
  {
    std::lock_guard lk(mu_);
    if (dead()) {
      dead_reason = death_reason_;
    } else {
      link(call);
      dest = handle_;
      sent = true;
    }
  }
  if (!sent) {   // fail outside the lock: callbacks may call back into this cell
    call->state->fail(Error{ErrorCode::ActorDied, label_ + " " + dead_reason});
    return;
  }
  if (timeout.count() > 0 && timer_ != nullptr) {
    // Scheduled after linking: a completion that wins the race finds no deadline to cancel,
    // and the late timer then finds the call unlinked and does nothing.
    auto key = schedule_deadline(call, method, timeout);
    std::lock_guard lk(mu_);
    if (call->self) { call->deadline = key; call->has_deadline = true; }
  }
  caf::anon_send(dest, CallMsg{std::move(call), method, std::move(args)});
}

DeadlineTimer::Key ActorCell::schedule_deadline(const std::shared_ptr<PendingCall>& call, const char* method,
                                                std::chrono::nanoseconds timeout) {
  std::weak_ptr<ActorCell> weak_cell = weak_from_this();
  std::weak_ptr<PendingCall> weak_call = call;
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(timeout).count();
  std::string what = label_ + "." + method + " took longer than " + std::to_string(ms) + " ms";
  return timer_->schedule(DeadlineTimer::Clock::now() + timeout, [weak_cell, weak_call, what = std::move(what)] {
    auto cell = weak_cell.lock();
    auto call = weak_call.lock();
    if (cell && call) cell->fail_call(*call, Error{ErrorCode::Timeout, what});
  });
}

std::shared_ptr<StateBase> ActorCell::take(PendingCall& call) {
  std::shared_ptr<PendingCall> keep;
  {
    std::lock_guard lk(mu_);
    keep = unlink(call);
  }
  if (!keep) return nullptr;
  if (call.has_deadline) timer_->cancel(call.deadline);
  return std::move(call.state);
}

void ActorCell::complete(PendingCall& call, const Payload& reply) {
  if (auto s = take(call)) s->complete_from(reply);
}

void ActorCell::fail_call(PendingCall& call, Error error) {
  if (auto s = take(call)) s->fail(std::move(error));
}

caf::actor ActorCell::mark_dead(const std::string& reason) {
  std::vector<std::shared_ptr<PendingCall>> calls;
  caf::actor handle;
  {
    std::lock_guard lk(mu_);
    if (dead()) return {};
    dead_.store(true, std::memory_order_release);
    death_reason_ = reason;
    calls.reserve(count_);
    while (head_ != nullptr) calls.push_back(unlink(*head_));
    handle.swap(handle_);
  }
  for (auto& call : calls) {
    if (call->has_deadline) timer_->cancel(call->deadline);
    call->state->fail(Error{ErrorCode::ActorDied, label_ + " " + reason});
  }
  return handle;
}

std::size_t ActorCell::in_flight() const {
  std::lock_guard lk(mu_);
  return count_;
}

// --- the non-template half of ActorRef -------------------------------------------------------------
void submit_call(const std::shared_ptr<ActorCell>& cell, const char* method, Payload args,
                 std::shared_ptr<StateBase> state, std::chrono::nanoseconds timeout) {
  if (!cell) {
    state->fail(Error{ErrorCode::BadArguments, "call through an empty ActorRef"});
    return;
  }
  cell->submit(method, std::move(args), std::move(state), timeout);
}

std::uint64_t cell_id(const ActorCell& cell) { return cell.id(); }
const std::string& cell_label(const ActorCell& cell) { return cell.label(); }
const std::string& cell_type(const ActorCell& cell) { return cell.type(); }

}  // namespace troupe::detail
