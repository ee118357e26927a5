// ActorRef<T>: a handle to one actor, named by id (not by thread or process). Calls through it are
// encoded with msgpack, run one at a time in submission order, and resolve a Future (a method
// returning a Future answers when that completes: see TROUPE_ACTOR).
// ActorGroup<T>: n actors of one type, called together. Both are cheap to copy and thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "troupe/codec.hpp"
#include "troupe/future.hpp"
#include "troupe/placement/dispatcher.hpp"
#include "troupe/registry.hpp"

namespace troupe {

namespace detail {
class ActorCell;
// Sends one call; the reply, a failure or the deadline completes `state`. Never throws. `here`:
// the caller waits for it at once, and it may run on the caller's thread (ActorRef::call_sync).
void submit_call(const std::shared_ptr<ActorCell>& cell, const char* method, Payload args,
                 std::shared_ptr<StateBase> state, std::chrono::nanoseconds timeout, bool here = false);
// Sends one call whose outcome nobody waits for; a failure is logged. Never throws.
void submit_tell(const std::shared_ptr<ActorCell>& cell, const char* method, Payload args);
// Logs a tell that could not even be sent (an unregistered method, unencodable arguments).
void log_untold(const char* method, const Error& error);
std::uint64_t cell_id(const ActorCell& cell);
const std::string& cell_label(const ActorCell& cell);
const std::string& cell_type(const ActorCell& cell);       // the registered type name
Future<void> cell_ready(const ActorCell& cell);
// The cell of actor `id` in this process's runtime: a local one, or (cluster actors) a remote cell
// bound through the head's directory. Null if there is no runtime or no such actor here.
std::shared_ptr<ActorCell> resolve_cell(std::uint64_t id, const std::string& type);
bool cell_remote(const ActorCell& cell);   // hosted by another process

// The id an ActorRef travels as: its own, or (crossing to another process, for an actor of this
// one) the cluster id it is exported under. Throws ErrorException when it cannot be exported.
std::uint64_t ref_wire_id(const std::shared_ptr<ActorCell>& cell);

// The argument as the method's parameter type P: by reference when it already is one.
template <class P, class A>
decltype(auto) as_param(A&& a) {
  if constexpr (std::is_same_v<std::decay_t<A>, P>) return (a); else return P(std::forward<A>(a));
}
template <class... P, class... A>
Payload encode_as(std::tuple<P...>*, A&&... args) {
  return encode_args(as_param<P>(std::forward<A>(args))...);
}
}  // namespace detail

template <class T>
class ActorRef {
 public:
  ActorRef() = default;
  explicit ActorRef(std::shared_ptr<detail::ActorCell> cell) : cell_(std::move(cell)) {}

  bool valid() const noexcept { return cell_ != nullptr; }
  // Hosted by another process: its calls cross a link, and call_sync never runs one on the caller's thread.
  bool remote() const { return cell_ != nullptr && detail::cell_remote(*cell_); }
  std::uint64_t id() const { return detail::cell_id(*cell_); }
  const std::string& label() const { return detail::cell_label(*cell_); }   // "Counter#3"
  // Completes once the actor's constructor has run (in its worker process, for remote actors);
  // fails with ActorDied if the constructor threw or the actor died first.
  Future<void> ready() const { return detail::cell_ready(*cell_); }

  // The same actor, with a deadline on each call made through the copy.
  ActorRef with_timeout(std::chrono::milliseconds t) const { ActorRef r = *this; r.timeout_ = t; return r; }

  // Calls a method registered with TROUPE_ACTOR. Arguments convert to the declared parameter
  // types; an unregistered method or unencodable argument fails the future (BadArguments).
  template <class M, class... A>
  auto call(M method, A&&... args) const {
    return send_call(false, method, std::forward<A>(args)...);
  }

  // Calls and waits: call(method, args...).get(), the value or a CallError. When the actor is in
  // this process, constructed and idle (no call of this process running, queued or answering
  // later) and the call has no deadline (none set here, and no Options::call_timeout or runtime
  // call timeout), the method runs on the calling thread: no hand-over to the actor's thread and no
  // wake-up, so a driver's calls one after another cost what their methods cost (the call is still
  // encoded, and the actor still runs one call at a time, in order). Otherwise, or to another
  // process, it is call().get(). Where it runs here: the method runs on the caller's thread, with
  // that thread's thread-locals (an actor whose methods depend on their own thread's, such as
  // libtorch's intra-op thread count, autograd mode or a CUDA device made current in its
  // constructor, sets them per call, as troupe's actors do: actors::ComputeScope, or is not called
  // this way); a kill while it runs fails the call only when the method returns; and calls from
  // other processes waiting in its mailbox may be overtaken (their order with this one is not
  // defined either way).
  template <class M, class... A>
  auto call_sync(M method, A&&... args) const {
    return send_call(true, method, std::forward<A>(args)...).get();
  }

  // Fire and forget: the same call with no future. Nothing waits for it and nothing is returned;
  // a failure (of encoding, delivery or the method) is logged as a warning. For notices whose
  // outcome the caller does not need (a release, a progress report).
  template <class M, class... A>
  void tell(M method, A&&... args) const {
    using Tr = detail::MethodTraits<M>;
    static_assert(std::is_base_of_v<typename Tr::Class, T>, "method of another class");
    static_assert(sizeof...(A) == Tr::arity, "wrong number of arguments for this method");
    const char* name = detail::method_name<T>(method);
    if (name == nullptr) {
      detail::log_untold("?", Error{ErrorCode::BadArguments, "method not registered with TROUPE_ACTOR"});
      return;
    }
    Payload p;
    try {
      detail::RemoteArgs crossing(cell_ != nullptr && detail::cell_remote(*cell_));
      p = detail::encode_as(static_cast<typename Tr::Values*>(nullptr), std::forward<A>(args)...);
    } catch (const ErrorException& e) {
      detail::log_untold(name, e.error());
      return;
    } catch (const std::exception& e) {
      detail::log_untold(name, Error{ErrorCode::BadArguments, e.what()});
      return;
    }
    detail::submit_tell(cell_, name, std::move(p));
  }

  // Calls a method by name with already-chosen argument types (for dynamic callers: CLIs, tests,
  // other languages). A type mismatch is found by the actor and fails the future (BadArguments).
  template <class R, class... A>
  Future<R> call_by_name(const std::string& method, const A&... args) const {
    Payload p;
    try {
      detail::RemoteArgs crossing(cell_ != nullptr && detail::cell_remote(*cell_));
      p = encode_args(args...);
    } catch (const ErrorException& e) {
      return make_error_future<R>(e.error());
    }
    return call_encoded<R>(method.c_str(), std::move(p));
  }

  // Sends pre-encoded arguments. `method` must stay valid only for the duration of the call.
  template <class R>
  Future<R> call_encoded(const char* method, Payload args, bool here = false) const {
    Promise<R> p;
    detail::submit_call(cell_, method, std::move(args), p.state(), timeout_, here);
    return p.future();
  }

  const std::shared_ptr<detail::ActorCell>& cell() const { return cell_; }
  friend bool operator==(const ActorRef& a, const ActorRef& b) { return a.cell_ == b.cell_; }

 private:
  template <class M, class... A>
  auto send_call(bool here, M method, A&&... args) const {
    using Tr = detail::MethodTraits<M>;
    static_assert(std::is_base_of_v<typename Tr::Class, T>, "method of another class");
    static_assert(sizeof...(A) == Tr::arity, "wrong number of arguments for this method");
    using R = typename Tr::Result;
    const char* name = detail::method_name<T>(method);
    if (name == nullptr) {
      return make_error_future<R>(Error{ErrorCode::BadArguments, "method not registered with TROUPE_ACTOR"});
    }
    Payload p;
    try {
      detail::RemoteArgs crossing(cell_ != nullptr && detail::cell_remote(*cell_));
      p = detail::encode_as(static_cast<typename Tr::Values*>(nullptr), std::forward<A>(args)...);
    } catch (const ErrorException& e) {   // a ref that could not be made callable from there
      return make_error_future<R>(e.error());
    } catch (const std::exception& e) {
      return make_error_future<R>(Error{ErrorCode::BadArguments, e.what()});
    }
    return call_encoded<R>(name, std::move(p), here);
  }

  std::shared_ptr<detail::ActorCell> cell_;
  std::chrono::nanoseconds timeout_{0};
};

template <class T>
class ActorGroup {
 public:
  ActorGroup() = default;
  explicit ActorGroup(std::vector<ActorRef<T>> members)
      : members_(std::move(members)),
        dispatcher_(std::make_shared<placement::LeastLoadedDispatcher>(members_.size())) {}

  std::size_t size() const { return members_.size(); }
  const ActorRef<T>& operator[](std::size_t i) const { return members_.at(i); }
  const std::vector<ActorRef<T>>& members() const { return members_; }
  auto begin() const { return members_.begin(); }
  auto end() const { return members_.end(); }

  // The same call on every member; results indexed by member (Future<void> for void methods).
  template <class M, class... A>
  auto call_all(M method, const A&... args) const {
    return when_all(call_each(method, args...));
  }
  // The same call on every member, a future each (in member order).
  template <class M, class... A>
  std::vector<Future<typename detail::MethodTraits<M>::Result>> call_each(M method, const A&... args) const {
    std::vector<Future<typename detail::MethodTraits<M>::Result>> fs;
    fs.reserve(members_.size());
    for (auto& m : members_) fs.push_back(m.call(method, args...));
    return fs;
  }

  // Member i receives shards[i] as the method's one argument; shards.size() must equal size().
  template <class M, class S>
  auto scatter(M method, std::vector<S> shards) const {
    using R = typename detail::MethodTraits<M>::Result;
    using Out = decltype(when_all(std::vector<Future<R>>{}));
    if (shards.size() != members_.size()) {
      return Out(make_error_future<typename Out::value_type>(Error{ErrorCode::BadArguments,
          "scatter: " + std::to_string(shards.size()) + " shards for " + std::to_string(members_.size()) + " members"}));
    }
    std::vector<Future<R>> fs;
    fs.reserve(members_.size());
    for (std::size_t i = 0; i < members_.size(); ++i) fs.push_back(members_[i].call(method, std::move(shards[i])));
    return when_all(std::move(fs));
  }

  // One call, to the member with the least outstanding cost among this group's balanced calls
  // (e.g. cost = a sequence's tokens): the scheduler's answer to uneven work in multi-stage
  // pipelines. The cost is returned when the call completes. Copies of a group share the load.
  template <class M, class... A>
  auto call_balanced(std::int64_t cost, M method, A&&... args) const {
    using R = typename detail::MethodTraits<M>::Result;
    auto ticket = dispatcher_ ? dispatcher_->acquire(cost < 0 ? 0 : cost) : std::nullopt;
    if (!ticket) return make_error_future<R>(Error{ErrorCode::Unavailable, "call_balanced on an empty group"});
    auto f = members_[ticket->member].call(method, std::forward<A>(args)...);
    f.state()->on_ready([d = dispatcher_, t = *ticket] { d->release(t); });
    return f;
  }
  // The cost of member i's balanced calls still in flight. Released right after each call's
  // future completes (a waiter may see the value a moment before the release).
  std::int64_t outstanding_cost(std::size_t i) const { return dispatcher_ ? dispatcher_->outstanding_cost(i) : 0; }

 private:
  std::vector<ActorRef<T>> members_;
  std::shared_ptr<placement::LeastLoadedDispatcher> dispatcher_;
};

}  // namespace troupe

// --- msgpack adaptor: an ActorRef travels as its actor id -----------------------------------------
namespace msgpack {
MSGPACK_API_VERSION_NAMESPACE(MSGPACK_DEFAULT_API_NS) {
namespace adaptor {

template <class T>
struct pack<troupe::ActorRef<T>> {
  template <class Stream>
  packer<Stream>& operator()(packer<Stream>& o, const troupe::ActorRef<T>& r) const {
    std::uint64_t id = r.valid() ? troupe::detail::ref_wire_id(r.cell()) : 0;
    char b[8];
    for (int i = 0; i < 8; ++i) b[i] = static_cast<char>((id >> (8 * i)) & 0xff);
    o.pack_ext(8, troupe::detail::kActorRefExt);
    o.pack_ext_body(b, 8);
    return o;
  }
};

template <class T>
struct convert<troupe::ActorRef<T>> {
  const msgpack::object& operator()(const msgpack::object& o, troupe::ActorRef<T>& r) const {
    if (o.type != msgpack::type::EXT || o.via.ext.type() != troupe::detail::kActorRefExt || o.via.ext.size != 8) {
      throw troupe::DecodeError("expected an actor reference");
    }
    std::uint64_t id = 0;
    for (int i = 0; i < 8; ++i) id |= std::uint64_t(std::uint8_t(o.via.ext.data()[i])) << (8 * i);
    if (id == 0) { r = troupe::ActorRef<T>(); return o; }
    auto cell = troupe::detail::resolve_cell(id, troupe::detail::ActorTraits<T>::name());
    if (!cell) throw troupe::DecodeError("unknown actor id " + std::to_string(id));
    if (troupe::detail::cell_type(*cell) != troupe::detail::ActorTraits<T>::name()) {
      throw troupe::DecodeError("actor " + std::to_string(id) + " is a " + troupe::detail::cell_type(*cell));
    }
    r = troupe::ActorRef<T>(std::move(cell));
    return o;
  }
};

}  // namespace adaptor
}  // MSGPACK_API_VERSION_NAMESPACE
}  // namespace msgpack
