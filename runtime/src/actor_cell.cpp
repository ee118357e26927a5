#include "actor_cell.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <utility>

#include "troupe/actor_ref.hpp"

namespace troupe::detail {

// What a call needs to be sent (again) on a remote route, beside its CallLink.
struct CallRecord {
  std::string method;
  Payload args;                          // kept while it may be sent: queued, or retryable
  int attempts = 0;
  const Route* via = nullptr;            // the route its attempt is on; null: unsent (queued)
  std::uint64_t incarnation = 0;         // via's: only its replies answer the call (FT-2)
  std::vector<std::uint64_t> regions;    // argument tensors exposed for that attempt
  std::chrono::steady_clock::time_point sent_at{};   // of that attempt
};

void CallRecordDeleter::operator()(CallRecord* r) const noexcept { delete r; }

ActorCell::ActorCell(CellSpec spec, CallTableEnv env) : spec_(std::move(spec)), env_(env) {}

ActorCell::~ActorCell() { mark_dead("was released"); }

void ActorCell::link(const std::shared_ptr<StateBase>& call) {
  CallLink& l = call->call_link;
  l.self = call;
  l.seq = next_seq_++;
  l.prev = tail_;
  if (tail_ != nullptr) tail_->call_link.next = call.get(); else head_ = call.get();
  tail_ = call.get();
}

std::shared_ptr<StateBase> ActorCell::unlink(StateBase& call, std::vector<std::uint64_t>* regions) {
  CallLink& l = call.call_link;
  if (!l.self) return nullptr;   // not linked: already completed or failed
  if (l.prev != nullptr) l.prev->call_link.next = l.next; else head_ = l.next;
  if (l.next != nullptr) l.next->call_link.prev = l.prev; else tail_ = l.prev;
  l.prev = l.next = nullptr;
  if (l.record) {
    if (regions != nullptr) regions->insert(regions->end(), l.record->regions.begin(), l.record->regions.end());
    recorded_.erase(l.seq);
    l.record.reset();
  }
  return std::move(l.self);
}

void ActorCell::release(std::vector<std::uint64_t>& regions) const {
  if (!regions.empty() && env_.release != nullptr) env_.release(regions);
  regions.clear();
}

void ActorCell::submit(const char* method, Payload args, std::shared_ptr<StateBase> call,
                       std::chrono::nanoseconds timeout, bool here) {
  if (timeout.count() <= 0) timeout = spec_.default_timeout;
  const bool with_deadline = timeout.count() > 0 && env_.timer != nullptr;
  std::shared_ptr<Route> local;
  std::uint64_t seq = 0;
  bool is_dead = false;
  bool claimed = false;
  {
    std::lock_guard lk(mu_);
    is_dead = dead();
    if (!is_dead && route_local_) {   // the fast path: a local route never changes once bound
      // Run here only with no call in flight (none queued ahead of this one, none answering later),
      // none running and none waiting in the host's mailbox (try_claim): linked first, every later
      // call waits for this one.
      // Also on the actor's own thread lent to another actor's call (a share group's): its host
      // would take this one only after that call, which may be waiting for it.
      claimed = ((here && !with_deadline) || route_->lent_to_this_thread()) && head_ == nullptr && route_->try_claim();
      link(call);
      seq = call->call_link.seq;
      local = route_;
      if (!claimed && !reply_times_.empty()) {   // its host runs it: when a long method's reply may come
        const ReplyTime* t = reply_time_locked(method);
        if (t != nullptr && t->typical >= kLocalExpectFrom) call->expect_reply(std::chrono::steady_clock::now() + t->typical);
      }
    }
  }
  if (claimed) {   // a kill meanwhile fails the call; it still runs to its end on this thread
    local->run_claimed(shared_from_this(), method, args, call);
    return;
  }
  if (local) {
    if (!with_deadline) {   // the call is the list's and the route's now: no reference to keep here
      local->post(method, std::move(args), std::move(call));
      return;
    }
    local->post(method, std::move(args), std::shared_ptr<StateBase>(call));
  } else if (!is_dead) {
    call->mark_remote();
    std::vector<Unsendable> unsendable;
    std::unique_lock send(send_mu_);
    std::shared_ptr<Route> route;
    {
      std::lock_guard lk(mu_);
      is_dead = dead();
      if (!is_dead) {
        link(call);
        seq = call->call_link.seq;
        route = route_;
        auto rec = std::unique_ptr<CallRecord, CallRecordDeleter>(new CallRecord{method, {}, 0, nullptr, 0, {}});
        if (!route) rec->args = std::move(args);                   // queued: sent from here at bind
        else if (spec_.max_retries > 0) rec->args = args;          // it may be sent again
        if (route) {                                               // on it from now: unbind() sees it
          rec->via = route.get();
          rec->incarnation = route_incarnation_;
          rec->attempts = 1;
          sending_locked(*rec, *call);
        }
        call->call_link.record = std::move(rec);
        recorded_[seq] = call.get();
      }
    }
    if (route) deliver(*route, Pending{seq, method, std::move(args), call}, unsendable);
    send.unlock();
    fail_unsendable(unsendable);
  }
  if (is_dead) {   // failed outside the lock: callbacks may call back into this cell
    Error error;
    {
      std::lock_guard lk(mu_);
      error = death_error_;
    }
    call->fail(std::move(error));
    return;
  }
  if (with_deadline) {
    // Scheduled after linking: a timer that fires before the key is stored finds the call
    // linked and fails it; one that fires after completion finds it unlinked and does nothing.
    auto key = schedule_deadline(call, method, timeout);
    std::lock_guard lk(mu_);
    if (call->call_link.self) { call->call_link.deadline = key; call->call_link.has_deadline = true; }
  }
}

void ActorCell::fail_unsendable(std::vector<Unsendable>& unsendable) {
  for (auto& u : unsendable) u.state->fail(std::move(u.error));
  unsendable.clear();
}

void ActorCell::deliver(Route& route, Pending p, std::vector<Unsendable>& unsendable) {
  std::shared_ptr<StateBase> call = p.state;
  Attempt attempt{p.seq, p.method.c_str(), std::move(p.args), std::move(p.state)};
  Sent sent = route.send(std::move(attempt));
  if (sent.error) {
    release(sent.regions);
    if (auto s = take(*call)) unsendable.push_back({std::move(s), std::move(*sent.error)});
    return;
  }
  if (sent.regions.empty() && sent.via == &route) return;
  {
    std::lock_guard lk(mu_);
    CallRecord* rec = call->call_link.self ? call->call_link.record.get() : nullptr;
    if (rec != nullptr && rec->via == &route) {   // still this attempt (a reply may have come first)
      rec->via = sent.via;
      rec->regions = std::move(sent.regions);
      if (sent.via == nullptr) rec->args = std::move(attempt.args);   // unsent: kept for the next bind
    }
  }
  release(sent.regions);   // the call was answered already: the callee is done with them
}

const ActorCell::ReplyTime* ActorCell::reply_time_locked(std::string_view method) const {
  auto t = std::find_if(reply_times_.begin(), reply_times_.end(), [&](const ReplyTime& x) { return x.method == method; });
  return t != reply_times_.end() ? &*t : nullptr;
}

void ActorCell::note_reply_time_locked(std::string_view method, std::chrono::nanoseconds took) {
  ReplyTime* t = reply_time_locked(method);
  if (t == nullptr) t = &reply_times_.emplace_back(ReplyTime{std::string(method)});
  t->last[t->next] = took;
  t->next = (t->next + 1) % kReplyTimes;
  t->count = std::min(t->count + 1, kReplyTimes);
  auto held = t->last;
  const auto mid = held.begin() + std::ptrdiff_t((t->count - 1) / 2);
  std::nth_element(held.begin(), mid, held.begin() + std::ptrdiff_t(t->count));
  t->typical = *mid;
}

std::chrono::nanoseconds ActorCell::typical_reply_time(std::string_view method) const {
  std::lock_guard lk(mu_);
  const ReplyTime* t = reply_time_locked(method);
  return t != nullptr ? t->typical : std::chrono::nanoseconds::zero();
}

void ActorCell::sending_locked(CallRecord& rec, StateBase& call) {
  rec.sent_at = std::chrono::steady_clock::now();
  if (const ReplyTime* t = reply_time_locked(rec.method)) call.expect_reply(rec.sent_at + t->typical);
}

ActorCell::Pending ActorCell::take_for_send_locked(std::uint64_t seq, const Route* route) {
  StateBase* st = recorded_.at(seq);
  CallRecord& rec = *st->call_link.record;
  rec.via = route;
  rec.incarnation = route->incarnation();
  rec.attempts += 1;
  sending_locked(rec, *st);
  Payload args = spec_.max_retries > 0 ? rec.args : std::move(rec.args);
  return Pending{seq, rec.method, std::move(args), st->call_link.self};
}

// A cell found dead (before, or while its queued calls went out) never takes the route, which is
// stopped: a host spawned for it exits rather than live on, its object with it.
void ActorCell::bind(std::shared_ptr<Route> route) {
  std::vector<Unsendable> unsendable;
  bool published = false;
  {
    std::lock_guard send(send_mu_);
    std::vector<Pending> queued;
    bool is_dead = false;
    {
      std::lock_guard lk(mu_);
      is_dead = dead();
      for (StateBase* c = is_dead ? nullptr : head_; c != nullptr; c = c->call_link.next) {
        const auto& rec = c->call_link.record;
        if (rec && rec->via == nullptr) queued.push_back(take_for_send_locked(c->call_link.seq, route.get()));
      }
    }
    // Sent before the route is published: no newer call can overtake them (slow-path submits wait
    // for send_mu_, and the fast path needs a published local route).
    for (auto& p : queued) deliver(*route, std::move(p), unsendable);
    if (!is_dead) {
      std::lock_guard lk(mu_);
      if (!dead()) {
        route_local_ = route->local();
        route_incarnation_ = route->incarnation();
        route_ = route;
        published = true;
      }
    }
  }
  fail_unsendable(unsendable);
  if (!published) route->stop();
}

std::vector<std::uint64_t> ActorCell::withdraw_locked(const std::function<bool(const Route*)>& lost,
                                                      std::vector<std::shared_ptr<StateBase>>& failed,
                                                      std::vector<std::uint64_t>& regions) {
  std::vector<std::uint64_t> retry;
  std::vector<StateBase*> give_up;
  for (StateBase* c = head_; c != nullptr; c = c->call_link.next) {
    CallRecord* rec = c->call_link.record.get();
    if (rec == nullptr || rec->via == nullptr || !lost(rec->via)) continue;
    regions.insert(regions.end(), rec->regions.begin(), rec->regions.end());
    rec->regions.clear();
    if (rec->attempts <= spec_.max_retries) {
      rec->via = nullptr;
      retry.push_back(c->call_link.seq);
    } else {
      give_up.push_back(c);
    }
  }
  for (StateBase* c : give_up) {
    if (auto s = unlink(*c, &regions)) failed.push_back(std::move(s));
  }
  return retry;
}

void ActorCell::fail_all(std::vector<std::shared_ptr<StateBase>>& calls, std::vector<std::uint64_t>& regions,
                         const Error& error) {
  release(regions);
  for (auto& s : calls) {
    if (s->call_link.has_deadline && env_.timer != nullptr) env_.timer->cancel(s->call_link.deadline);
    s->fail(error);
  }
}

void ActorCell::unbind(std::uint64_t incarnation, const std::string& reason) {
  std::vector<std::shared_ptr<StateBase>> failed;
  std::vector<std::uint64_t> regions;
  std::shared_ptr<Route> gone;   // destroyed outside the locks
  {
    std::lock_guard send(send_mu_);
    std::lock_guard lk(mu_);
    if (!route_ || route_local_ || route_incarnation_ != incarnation) return;
    gone = std::move(route_);
    route_incarnation_ = 0;
    (void)withdraw_locked([](const Route*) { return true; }, failed, regions);   // resent at the next bind
  }
  fail_all(failed, regions, Error{ErrorCode::ActorDied, spec_.label + " " + reason});
}

void ActorCell::route_broken(const Route* broken, const std::string& reason) {
  std::vector<std::shared_ptr<StateBase>> failed;
  std::vector<std::uint64_t> regions;
  std::vector<Unsendable> unsendable;
  std::shared_ptr<Route> gone;
  {
    std::lock_guard send(send_mu_);
    std::shared_ptr<Route> next;
    std::vector<Pending> resend;
    {
      std::lock_guard lk(mu_);
      if (!route_ || route_.get() != broken) return;
      next = route_->fallback();
      for (auto seq : withdraw_locked([broken](const Route* via) { return via == broken; }, failed, regions)) {
        if (next) resend.push_back(take_for_send_locked(seq, next.get()));
      }
      gone = std::move(route_);
      route_ = next;   // null: later calls queue until the next bind
      route_local_ = next && next->local();
      route_incarnation_ = next ? next->incarnation() : 0;
    }
    for (auto& p : resend) deliver(*next, std::move(p), unsendable);
  }
  fail_unsendable(unsendable);
  fail_all(failed, regions, Error{ErrorCode::Unavailable, spec_.label + " " + reason + " (the call may have run)"});
}

std::shared_ptr<Route> ActorCell::route() const {
  std::lock_guard lk(mu_);
  return route_;
}

std::shared_ptr<StateBase> ActorCell::take_reply(std::uint64_t incarnation, std::uint64_t seq) {
  std::shared_ptr<StateBase> state;
  std::vector<std::uint64_t> regions;
  {
    std::lock_guard lk(mu_);
    auto it = recorded_.find(seq);
    if (it == recorded_.end()) return nullptr;
    const CallRecord& rec = *it->second->call_link.record;
    // FT-2: only a reply of the incarnation its attempt went to (bind() sends queued calls
    // before it publishes the route, so the bound route is not the test).
    if (rec.via == nullptr || rec.incarnation != incarnation) return nullptr;
    note_reply_time_locked(rec.method, std::chrono::steady_clock::now() - rec.sent_at);
    state = unlink(*it->second, &regions);
  }
  release(regions);   // the callee has finished with our argument tensors
  if (state && state->call_link.has_deadline && env_.timer != nullptr) env_.timer->cancel(state->call_link.deadline);
  return state;
}

Timer::Key ActorCell::schedule_deadline(const std::shared_ptr<StateBase>& call, const char* method,
                                        std::chrono::nanoseconds timeout) {
  std::weak_ptr<ActorCell> weak_cell = weak_from_this();
  std::weak_ptr<StateBase> weak_call = call;
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(timeout).count();
  std::string what = spec_.label + "." + method + " took longer than " + std::to_string(ms) + " ms";
  return env_.timer->schedule(Timer::Clock::now() + timeout, [weak_cell, weak_call, what = std::move(what)] {
    auto cell = weak_cell.lock();
    auto call = weak_call.lock();
    if (cell && call) cell->fail_call(*call, Error{ErrorCode::Timeout, what});
  });
}

std::shared_ptr<StateBase> ActorCell::take(StateBase& call, const char* method, std::chrono::nanoseconds ran) {
  std::shared_ptr<StateBase> keep;
  std::vector<std::uint64_t> regions;
  {
    std::lock_guard lk(mu_);
    keep = unlink(call, &regions);
    // A long run, or one of a method timed already (so that its typical time follows it down).
    if (method != nullptr && (ran >= kLocalExpectFrom || (ran.count() > 0 && reply_time_locked(method) != nullptr)))
      note_reply_time_locked(method, ran);
  }
  release(regions);
  if (keep && call.call_link.has_deadline && env_.timer != nullptr) env_.timer->cancel(call.call_link.deadline);
  return keep;
}

void ActorCell::complete(StateBase& call, const Payload& reply, const char* method, std::chrono::nanoseconds ran) {
  if (auto s = take(call, method, ran)) s->complete_from(reply);
}

void ActorCell::fail_call(StateBase& call, Error error) {
  if (auto s = take(call)) s->fail(std::move(error));
}

bool ActorCell::mark_dead(const std::string& reason) {
  return end(Error{ErrorCode::ActorDied, spec_.label + " " + reason});
}

bool ActorCell::mark_failed(Error error) { return end(std::move(error)); }

bool ActorCell::end(Error error) {
  std::vector<std::shared_ptr<StateBase>> calls;
  std::vector<std::uint64_t> regions;
  std::shared_ptr<Route> route;
  {
    std::lock_guard lk(mu_);
    if (dead()) return false;
    dead_.store(true, std::memory_order_release);
    death_error_ = error;
    while (head_ != nullptr) calls.push_back(unlink(*head_, &regions));
    route = std::move(route_);   // a local route holds its host: let go of it (the host holds this cell)
    route_local_ = false;
    route_incarnation_ = 0;
  }
  ready_.set_error(error);
  fail_all(calls, regions, error);
  if (route) route->stop();
  return true;
}

// --- the non-template half of ActorRef -------------------------------------------------------------
void submit_call(const std::shared_ptr<ActorCell>& cell, const char* method, Payload args,
                 std::shared_ptr<StateBase> state, std::chrono::nanoseconds timeout, bool here) {
  if (!cell) {
    state->fail(Error{ErrorCode::BadArguments, "call through an empty ActorRef"});
    return;
  }
  cell->submit(method, std::move(args), std::move(state), timeout, here);
}

void submit_tell(const std::shared_ptr<ActorCell>& cell, const char* method, Payload args) {
  if (!cell) {
    spdlog::warn("tell {}: through an empty ActorRef; dropped", method);
    return;
  }
  auto state = std::make_shared<State<void>>();
  StateBase* raw = state.get();   // the callback runs while the state completes: it is alive
  state->on_ready([raw, what = cell->label() + "." + method] {
    if (raw->has_error()) spdlog::warn("tell {} failed: {}", what, raw->error().to_string());
  });
  cell->submit(method, std::move(args), std::move(state), std::chrono::nanoseconds(0));
}

void log_untold(const char* method, const Error& error) {
  spdlog::warn("tell {}: not sent: {}", method, error.to_string());
}

std::uint64_t cell_id(const ActorCell& cell) { return cell.id(); }
const std::string& cell_label(const ActorCell& cell) { return cell.label(); }
const std::string& cell_type(const ActorCell& cell) { return cell.type(); }
Future<void> cell_ready(const ActorCell& cell) { return cell.ready(); }

}  // namespace troupe::detail
