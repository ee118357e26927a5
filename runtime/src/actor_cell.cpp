#include "actor_cell.hpp"

#include <caf/send.hpp>

#include <vector>

#include "cluster/call_channel.hpp"
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

caf::actor ActorCell::handle() const {
  std::lock_guard lk(mu_);
  return handle_;
}

void ActorCell::make_remote(RemoteSettings settings) {
  remote_ = std::make_unique<Remote>();
  remote_->settings = std::move(settings);
}

void ActorCell::link(const std::shared_ptr<StateBase>& call) {
  CallLink& l = call->call_link;
  l.self = call;
  l.seq = next_seq_++;
  l.prev = tail_;
  if (tail_ != nullptr) tail_->call_link.next = call.get(); else head_ = call.get();
  tail_ = call.get();
  ++count_;
}

std::shared_ptr<StateBase> ActorCell::unlink(StateBase& call, std::vector<std::uint64_t>* regions) {
  CallLink& l = call.call_link;
  if (!l.self) return nullptr;   // not linked: already completed or failed
  if (l.prev != nullptr) l.prev->call_link.next = l.next; else head_ = l.next;
  if (l.next != nullptr) l.next->call_link.prev = l.prev; else tail_ = l.prev;
  l.prev = l.next = nullptr;
  --count_;
  if (remote_) {
    if (auto it = remote_->calls.find(l.seq); it != remote_->calls.end()) {
      if (regions != nullptr) regions->insert(regions->end(), it->second.regions.begin(), it->second.regions.end());
      remote_->calls.erase(it);
    }
    remote_->states.erase(l.seq);
  }
  return std::move(l.self);
}

void ActorCell::submit(const char* method, Payload args, std::shared_ptr<StateBase> call,
                       std::chrono::nanoseconds timeout) {
  if (timeout.count() <= 0) timeout = default_timeout_;
  if (remote_) {
    std::lock_guard send(remote_->send_mu);
    submit_remote(method, std::move(args), call);
  } else {
    caf::actor dest;
    std::string dead_reason;
    {
      std::lock_guard lk(mu_);
      if (dead()) dead_reason = death_reason_;
      else { link(call); dest = handle_; }
    }
    if (!dest) {   // dead: fail outside the lock, callbacks may call back into this cell
      call->fail(Error{ErrorCode::ActorDied, label_ + " " + dead_reason});
      return;
    }
    caf::anon_send(dest, CallMsg{call, method, std::move(args)});
  }
  if (timeout.count() > 0 && timer_ != nullptr) {
    // Scheduled after linking: a timer that fires before the key is stored finds the call
    // linked and fails it; one that fires after completion finds it unlinked and does nothing.
    auto key = schedule_deadline(call, method, timeout);
    std::lock_guard lk(mu_);
    if (call->call_link.self) { call->call_link.deadline = key; call->call_link.has_deadline = true; }
  }
}

void ActorCell::submit_remote(const char* method, Payload args, std::shared_ptr<StateBase> call) {
  std::optional<RemoteBinding> b;
  std::uint64_t seq = 0;
  std::string dead_reason;
  {
    std::lock_guard lk(mu_);
    if (dead()) {
      dead_reason = death_reason_;
    } else {
      link(call);
      seq = call->call_link.seq;
      remote_->states[seq] = call;
      b = remote_->binding;
      // The record keeps the arguments only while they may still be sent: queued (not bound yet)
      // or retryable. A bound call without retries is sent from `args` right below.
      Payload kept = !b ? std::move(args) : remote_->settings.max_retries > 0 ? args : Payload{};
      remote_->calls[seq] = RemoteCall{method, std::move(kept), 0, false, {}};
    }
  }
  if (seq == 0) {
    call->fail(Error{ErrorCode::ActorDied, label_ + " " + dead_reason});
    return;
  }
  if (b) send_remote(seq, *b, method, args);
}

void ActorCell::send_remote(std::uint64_t seq, const RemoteBinding& b, const std::string& method,
                            const Payload& args) {
  WireCall wc;
  WirePayload wp;
  try {
    wp = to_wire(args);
  } catch (const std::exception& e) {
    std::shared_ptr<StateBase> s;
    {
      std::lock_guard lk(mu_);
      if (auto it = remote_->states.find(seq); it != remote_->states.end()) {
        if (auto st = it->second.lock()) s = unlink(*st);
      }
    }
    if (s) s->fail(Error{ErrorCode::Unavailable, "could not send tensor arguments: " + std::string(e.what())});
    return;
  }
  {
    std::lock_guard lk(mu_);
    auto it = remote_->calls.find(seq);
    if (it == remote_->calls.end()) {   // completed (timed out) meanwhile
      release_regions(wp.regions);
      return;
    }
    it->second.sent = true;
    it->second.attempts += 1;
    it->second.regions = wp.regions;
    it->second.on_channel = b.channel != nullptr;   // corrected below in the rare fallback
  }
  wc.actor_id = id_;
  wc.incarnation = b.incarnation;
  wc.seq = seq;
  wc.method = method;
  wc.args = std::move(wp.bytes);
  wc.tensors = std::move(wp.tensors);
  if (b.channel && b.channel->send(wc)) return;
  if (b.channel) {   // it broke: this attempt goes through the middleman after all
    std::lock_guard lk(mu_);
    if (auto it = remote_->calls.find(seq); it != remote_->calls.end()) it->second.on_channel = false;
  }
  // Through the middleman. `settings` is fixed by make_remote(): no lock. (A channel presents the
  // token once per connection and routes replies itself: neither field travels on it.)
  wc.token = remote_->settings.token;
  wc.reply_to = remote_->settings.reply_to;
  caf::anon_send(b.host, std::move(wc));
}

void ActorCell::bind(RemoteBinding b) {
  std::lock_guard send(remote_->send_mu);
  std::vector<std::pair<std::uint64_t, std::pair<std::string, Payload>>> queued;
  {
    std::lock_guard lk(mu_);
    if (dead()) return;
    remote_->binding = b;
    for (auto& [seq, rc] : remote_->calls) {
      if (!rc.sent) queued.push_back({seq, {rc.method, rc.args}});
    }
  }
  ready_.set_value();
  for (auto& [seq, m] : queued) send_remote(seq, b, m.first, m.second);
}

// Under send_mu and mu_: the sent calls that `lost` selects lost their attempt. Their argument
// regions go to `regions`; those with a retry left are marked unsent and their seqs returned (in
// submission order), the others are unlinked into `failed`.
std::vector<std::uint64_t> ActorCell::withdraw_locked(const std::function<bool(const RemoteCall&)>& lost,
                                                      std::vector<std::shared_ptr<StateBase>>& failed,
                                                      std::vector<std::uint64_t>& regions) {
  std::vector<std::uint64_t> retry, give_up;
  for (auto& [seq, rc] : remote_->calls) {
    if (!rc.sent || !lost(rc)) continue;
    regions.insert(regions.end(), rc.regions.begin(), rc.regions.end());
    rc.regions.clear();
    if (rc.attempts <= remote_->settings.max_retries) {
      rc.sent = false;
      retry.push_back(seq);
    } else {
      give_up.push_back(seq);
    }
  }
  for (auto seq : give_up) {
    if (auto st = remote_->states[seq].lock()) {
      if (auto s = unlink(*st, &regions)) failed.push_back(std::move(s));
    }
  }
  return retry;
}

void ActorCell::fail_withdrawn(std::vector<std::shared_ptr<StateBase>>& failed, std::vector<std::uint64_t>& regions,
                               const Error& error) {
  release_regions(regions);
  for (auto& s : failed) {
    if (s->call_link.has_deadline) timer_->cancel(s->call_link.deadline);
    s->fail(error);
  }
}

void ActorCell::unbind(std::uint64_t incarnation, const std::string& reason) {
  std::vector<std::shared_ptr<StateBase>> failed;
  std::vector<std::uint64_t> regions;
  {
    std::lock_guard send(remote_->send_mu);
    std::lock_guard lk(mu_);
    if (!remote_->binding || remote_->binding->incarnation != incarnation) return;
    remote_->binding.reset();
    (void)withdraw_locked([](const RemoteCall&) { return true; }, failed, regions);   // resent at the next bind
  }
  fail_withdrawn(failed, regions, Error{ErrorCode::ActorDied, label_ + " " + reason});
}

void ActorCell::drop_channel(const cluster::CallChannel* channel, const std::string& reason) {
  std::vector<std::shared_ptr<StateBase>> failed;
  std::vector<std::uint64_t> regions;
  {
    std::lock_guard send(remote_->send_mu);
    std::vector<std::pair<std::uint64_t, std::pair<std::string, Payload>>> resend;
    RemoteBinding b;
    {
      std::lock_guard lk(mu_);
      if (!remote_->binding || remote_->binding->channel.get() != channel) return;
      remote_->binding->channel.reset();
      b = *remote_->binding;
      for (auto seq : withdraw_locked([](const RemoteCall& rc) { return rc.on_channel; }, failed, regions)) {
        const auto& rc = remote_->calls[seq];
        resend.push_back({seq, {rc.method, rc.args}});
      }
    }
    for (auto& [seq, m] : resend) send_remote(seq, b, m.first, m.second);   // now, through the middleman
  }
  fail_withdrawn(failed, regions, Error{ErrorCode::Unavailable, label_ + " " + reason + " (the call may have run)"});
}

std::optional<RemoteBinding> ActorCell::binding() const {
  std::lock_guard lk(mu_);
  return remote_ ? remote_->binding : std::nullopt;
}

void ActorCell::on_reply(const WireReply& r) {
  std::shared_ptr<StateBase> state;
  std::vector<std::uint64_t> regions;
  {
    std::lock_guard lk(mu_);
    if (!remote_ || !remote_->binding || remote_->binding->incarnation != r.incarnation) return;   // FT-2
    auto it = remote_->states.find(r.seq);
    if (it == remote_->states.end()) return;
    if (auto st = it->second.lock()) state = unlink(*st, &regions);
  }
  release_regions(regions);   // the callee has finished with our argument tensors
  if (!state) return;
  if (state->call_link.has_deadline) timer_->cancel(state->call_link.deadline);
  if (r.code != 0) {
    bool known = r.code > 0 && r.code <= static_cast<int>(ErrorCode::Internal);
    state->fail(Error{known ? static_cast<ErrorCode>(r.code) : ErrorCode::Internal, r.error});
    return;
  }
  std::vector<std::uint64_t> fetched;
  try {
    Payload p = from_wire(r.result, r.tensors, std::chrono::seconds(60), &fetched);
    state->complete_from(p);
  } catch (const CallError& e) {
    state->fail(e.error());
  } catch (const std::exception& e) {
    state->fail(Error{ErrorCode::BadArguments, std::string("reply did not decode: ") + e.what()});
  }
  if (!fetched.empty() && r.gateway) caf::anon_send(r.gateway, WireRelease{fetched});
}

DeadlineTimer::Key ActorCell::schedule_deadline(const std::shared_ptr<StateBase>& call, const char* method,
                                                std::chrono::nanoseconds timeout) {
  std::weak_ptr<ActorCell> weak_cell = weak_from_this();
  std::weak_ptr<StateBase> weak_call = call;
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(timeout).count();
  std::string what = label_ + "." + method + " took longer than " + std::to_string(ms) + " ms";
  return timer_->schedule(DeadlineTimer::Clock::now() + timeout, [weak_cell, weak_call, what = std::move(what)] {
    auto cell = weak_cell.lock();
    auto call = weak_call.lock();
    if (cell && call) cell->fail_call(*call, Error{ErrorCode::Timeout, what});
  });
}

std::shared_ptr<StateBase> ActorCell::take(StateBase& call) {
  std::shared_ptr<StateBase> keep;
  std::vector<std::uint64_t> regions;
  {
    std::lock_guard lk(mu_);
    keep = unlink(call, &regions);
  }
  release_regions(regions);
  if (keep && call.call_link.has_deadline) timer_->cancel(call.call_link.deadline);
  return keep;
}

void ActorCell::complete(StateBase& call, const Payload& reply) {
  if (auto s = take(call)) s->complete_from(reply);
}

void ActorCell::fail_call(StateBase& call, Error error) {
  if (auto s = take(call)) s->fail(std::move(error));
}

caf::actor ActorCell::mark_dead(const std::string& reason) {
  std::vector<std::shared_ptr<StateBase>> calls;
  std::vector<std::uint64_t> regions;
  caf::actor handle;
  {
    std::lock_guard lk(mu_);
    if (dead()) return {};
    dead_.store(true, std::memory_order_release);
    death_reason_ = reason;
    calls.reserve(count_);
    while (head_ != nullptr) calls.push_back(unlink(*head_, &regions));
    handle.swap(handle_);
    if (remote_) remote_->binding.reset();
  }
  release_regions(regions);
  ready_.set_error(Error{ErrorCode::ActorDied, label_ + " " + reason});
  for (auto& call : calls) {
    if (call->call_link.has_deadline) timer_->cancel(call->call_link.deadline);
    call->fail(Error{ErrorCode::ActorDied, label_ + " " + reason});
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
Future<void> cell_ready(const ActorCell& cell) { return cell.ready(); }

}  // namespace troupe::detail
