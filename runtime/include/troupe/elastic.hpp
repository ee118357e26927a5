// Elastic groups: actor groups that grow and shrink while a job runs.
//
//   auto rollout = rt.spawn_elastic_group<Engine>(troupe::Elastic{1, 4}.name("rollout"),
//                                                 troupe::Options{}.process(true).cpus(1), args...);
//   rollout.on_join([&](const troupe::ActorRef<Engine>& e) { e.call(&Engine::pull, version).get(); });
//   for (auto& out : rollout.call_all(&Engine::generate, prompts).get()) ...   // a Result per member
//
// The head holds the group's target (min <= target <= max, max at first; `troupe job scale`
// changes it), starts members as the cluster has room, places freed room by the deficit rule
// (the group furthest below its target first), replaces members that die and stops the newest
// past the target. This process sees membership as epochs: a member the head started enters the
// next epoch only after on_join has run on it (a throw keeps it out until the next try), and one
// that died or was stopped leaves it. Every group call runs on one epoch's snapshot, taken when
// it is made; members that join meanwhile take part from the next call (EL-1). Below min members
// (the min given here) a group call fails at once with Unavailable, naming the group. A min of 0
// makes a group of optional helpers: its calls then run on whoever is there, possibly no one.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <tuple>
#include <type_traits>
#include <string>
#include <vector>

#include "troupe/actor_ref.hpp"
#include "troupe/runtime.hpp"

namespace troupe {

class Elastic {
 public:
  Elastic(int min, int max) : min_(min), max_(max) {}
  Elastic& name(std::string n) { name_ = std::move(n); return *this; }
  // How long spawn_elastic_group waits for min members to run (default 60 s).
  Elastic& wait_for_min(std::chrono::milliseconds t) { wait_ = t; return *this; }
  int min() const { return min_; }
  int max() const { return max_; }
  const std::string& name() const { return name_; }
  std::chrono::milliseconds wait() const { return wait_; }

 private:
  int min_ = 1, max_ = 1;
  std::string name_;
  std::chrono::milliseconds wait_{60000};
};

namespace detail {
std::uint64_t elastic_create(RuntimeImpl& rt, const ActorTypeInfo& type, const std::string& signature, Payload ctor_args,
                             const Options& opts, const Elastic& e);
std::vector<std::shared_ptr<ActorCell>> elastic_members(RuntimeImpl& rt, std::uint64_t group, const std::string& type,
                                                        const Options& opts);
Status elastic_wait(RuntimeImpl& rt, std::uint64_t group, std::size_t min, std::chrono::milliseconds timeout);
Status elastic_scale(RuntimeImpl& rt, std::uint64_t group, int target);
Status elastic_remove(RuntimeImpl& rt, std::uint64_t group);
void elastic_log(const std::string& what);   // troupe's log, a warning
}  // namespace detail

template <class T>
class ElasticGroup {
 public:
  using Hook = std::function<void(const ActorRef<T>&)>;
  using ResizeHook = std::function<void(const std::vector<ActorRef<T>>& before, const std::vector<ActorRef<T>>& now)>;

  ElasticGroup() = default;
  std::uint64_t id() const { return s_ ? s_->id : 0; }
  const std::string& name() const { return s_->name; }

  // This epoch's members, after admitting those the head started (on_join first) and dropping
  // those that left.
  std::vector<ActorRef<T>> members() const { return refresh().members(); }
  std::size_t size() const { return refresh().size(); }
  std::uint64_t epoch() const {
    refresh();
    std::lock_guard lk(s_->mu);
    return s_->epoch;
  }
  // Runs on each member before it enters an epoch (the current members too, at once).
  void on_join(Hook hook) {
    {
      std::lock_guard lk(s_->mu);
      s_->on_join = std::move(hook);
      s_->rejoin = true;
    }
    refresh();
  }
  void on_resize(ResizeHook hook) {
    std::lock_guard lk(s_->mu);
    s_->on_resize = std::move(hook);
  }
  // Sets the head's target for the group (min <= target <= max).
  Status scale(int target) const { return detail::elastic_scale(*s_->rt, s_->id, target); }
  // Removes the group at the head and stops its members (a group otherwise lives as long as the
  // process that made it). Its calls in flight fail with ActorDied.
  Status remove() const { return detail::elastic_remove(*s_->rt, s_->id); }

  // This group, its scatter's shards and balanced calls re-sent to another live member of the
  // group when theirs dies (ActorDied), up to as many times as the group has members. call_all's
  // results are per member: a departed member's slot keeps its ActorDied there.
  ElasticGroup retryable() const {
    ElasticGroup g = *this;
    g.retry_ = true;
    return g;
  }

  // Group calls on this epoch's members; below min members they fail at once with Unavailable.
  // call_all's results are per member (a Result each, in member order): a member that died or left
  // during the call has its error in its slot, and the others' results stand.
  template <class M, class... A>
  Future<std::vector<Result<typename detail::MethodTraits<M>::Result>>> call_all(M method, const A&... args) const {
    using R = typename detail::MethodTraits<M>::Result;
    auto g = refresh();
    if (g.size() < s_->min) return make_error_future<std::vector<Result<R>>>(below_min(g.size()));
    return when_all_results(g.call_each(method, args...));
  }
  template <class M, class S>
  auto scatter(M method, std::vector<S> shards) const {
    using R = typename detail::MethodTraits<M>::Result;
    auto g = refresh();
    using Out = decltype(g.scatter(method, std::move(shards)));
    if (g.size() < s_->min) return Out(make_error_future<typename Out::value_type>(below_min(g.size())));
    if (!retry_) return g.scatter(method, std::move(shards));
    if (shards.size() != g.size()) return g.scatter(method, std::move(shards));   // its refusal
    std::vector<Future<R>> fs;
    for (std::size_t i = 0; i < shards.size(); ++i) {
      Promise<R> p;
      fs.push_back(p.future());
      send<R>(s_, p, g[i], method, std::make_tuple(std::move(shards[i])), int(g.size()));
    }
    return when_all(std::move(fs));
  }
  template <class M, class... A>
  auto call_balanced(std::int64_t cost, M method, A&&... args) const {
    using R = typename detail::MethodTraits<M>::Result;
    auto g = refresh();
    if (g.size() < s_->min) return make_error_future<R>(below_min(g.size()));
    if (!retry_) return g.call_balanced(cost, method, std::forward<A>(args)...);
    // The balanced pick first; a resend goes to another live member.
    auto first = g.call_balanced(cost, method, args...);
    Promise<R> p;
    auto again = std::make_tuple(std::decay_t<A>(args)...);
    on_result<R>(s_, p, first, ActorRef<T>(), method, std::move(again), int(g.size()));
    return p.future();
  }

 private:
  friend class Runtime;
  struct State {
    detail::RuntimeImpl* rt = nullptr;
    std::uint64_t id = 0;
    std::string name, type;
    Options opts;
    std::size_t min = 1;
    std::mutex mu;                    // one refresh at a time; hooks run under it
    std::vector<ActorRef<T>> admitted;
    ActorGroup<T> current;            // the epoch's snapshot (its balanced-call load is per epoch)
    std::uint64_t epoch = 0;
    Hook on_join;
    ResizeHook on_resize;
    bool rejoin = false;              // a hook set after members were admitted runs on them too
    std::mutex snap_mu;               // the admitted members for resends (never held across a hook)
    std::vector<ActorRef<T>> snap;
    std::size_t rr = 0;
  };
  explicit ElasticGroup(std::shared_ptr<State> s) : s_(std::move(s)) {}

  // One call to `to`, re-sent to another admitted member when `to` died, `left` more times at most.
  template <class R, class M, class Args>
  static void send(std::shared_ptr<State> s, Promise<R> p, ActorRef<T> to, M method, Args args, int left) {
    auto f = std::apply([&](auto&... a) { return to.call(method, a...); }, args);
    on_result<R>(std::move(s), std::move(p), std::move(f), std::move(to), method, std::move(args), left);
  }
  template <class R, class M, class Args>
  static void on_result(std::shared_ptr<State> s, Promise<R> p, Future<R> f, ActorRef<T> to, M method, Args args, int left) {
    std::weak_ptr<detail::State<R>> weak = f.state();   // held weakly by its own callback (future.hpp, then)
    f.state()->on_ready([s = std::move(s), p, weak, to, method, args = std::move(args), left]() mutable {
      auto st = weak.lock();   // the completing thread holds it (StateBase::on_ready)
      if (!st) { p.set_error(Error{ErrorCode::Internal, "a group call's future was freed as it completed"}); return; }
      if (!st->has_error()) {
        if constexpr (std::is_void_v<R>) p.set_value();
        else p.set_value(std::move(st->value()));
        return;
      }
      const Error e = st->error();
      std::optional<ActorRef<T>> next;
      if (e.code == ErrorCode::ActorDied && left > 0) {
        std::lock_guard lk(s->snap_mu);
        for (std::size_t k = 0; k < s->snap.size() && !next; ++k) {   // the next one round, not the dead one
          const auto& m = s->snap[(s->rr++) % s->snap.size()];
          if (!to.valid() || m.id() != to.id()) next = m;
        }
      }
      if (!next) {
        p.set_error(e);
        return;
      }
      send<R>(s, p, *next, method, std::move(args), left - 1);
    });
  }

  Error below_min(std::size_t n) const {
    return Error{ErrorCode::Unavailable, "elastic group " + s_->name + " has " + std::to_string(n) +
                                             " members, fewer than its min of " + std::to_string(s_->min)};
  }

  ActorGroup<T> refresh() const {
    std::lock_guard lk(s_->mu);
    auto cells = detail::elastic_members(*s_->rt, s_->id, s_->type, s_->opts);
    std::vector<ActorRef<T>> next;
    bool changed = false;
    for (auto& cell : cells) {
      ActorRef<T> ref(cell);
      const bool known = std::any_of(s_->admitted.begin(), s_->admitted.end(),
                                     [&](const ActorRef<T>& a) { return a.id() == ref.id(); });
      if (!known || s_->rejoin) {
        if (s_->on_join) {
          try {
            s_->on_join(ref);
          } catch (const std::exception& e) {   // kept out of this epoch; tried again at the next refresh
            detail::elastic_log("elastic group " + s_->name + ": on_join failed on " + std::to_string(ref.id()) +
                                ": " + e.what());
            if (known) changed = true;
            continue;
          }
        }
        if (!known) changed = true;
      }
      next.push_back(std::move(ref));
    }
    s_->rejoin = false;
    if (next.size() != s_->admitted.size()) changed = true;
    if (changed) {
      auto before = std::move(s_->admitted);
      s_->admitted = next;
      s_->current = ActorGroup<T>(next);
      ++s_->epoch;
      {
        std::lock_guard sk(s_->snap_mu);
        s_->snap = next;
      }
      if (s_->on_resize) s_->on_resize(before, s_->admitted);
    }
    return s_->current;
  }

  std::shared_ptr<State> s_;
  bool retry_ = false;
};

template <class T, class... A>
ElasticGroup<T> Runtime::spawn_elastic_group(const Elastic& e, const Options& opts, A&&... args) {
  static_assert(detail::ActorTraits<T>::registered, "register the type with TROUPE_ACTOR(Type, methods...)");
  using Ctor = detail::CtorFactory<T, detail::wire_t<A>...>;
  (void)Ctor::registered;
  Payload p;
  {
    detail::RemoteArgs crossing(true);
    p = encode_args(detail::as_param<detail::wire_t<A>>(std::forward<A>(args))...);
  }
  const auto* type = detail::Registry::instance().find(detail::ActorTraits<T>::name());
  auto s = std::make_shared<typename ElasticGroup<T>::State>();
  s->rt = impl_.get();
  s->name = e.name().empty() ? type->name : e.name();
  s->type = type->name;
  s->opts = opts;
  s->min = std::size_t(e.min());
  s->id = detail::elastic_create(*impl_, *type, Ctor::signature(), std::move(p), opts, e);
  if (auto st = detail::elastic_wait(*impl_, s->id, std::size_t(e.min()), e.wait()); !st.ok()) throw CallError(st.error());
  ElasticGroup<T> group(std::move(s));
  group.refresh();
  return group;
}

}  // namespace troupe
