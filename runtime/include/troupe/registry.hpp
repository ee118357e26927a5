// The actor type registry. TROUPE_ACTOR(Type, method, ...) registers a plain C++ class and its
// methods by name, so any process of the same binary can construct it from msgpack constructor
// arguments and dispatch calls by method name. Registration happens during static
// initialisation; lookups afterwards are read-only and thread-safe.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <tuple>
#include <typeinfo>
#include <utility>
#include <vector>

#include "troupe/codec.hpp"
#include "troupe/detail/method_traits.hpp"
#include "troupe/future.hpp"
#include "troupe/named_registry.hpp"

namespace troupe::detail {

// While one is alive on this thread with `crossing` true, what is encoded goes to another process:
// an ActorRef to an actor of this process then encodes as a cluster id, the actor made callable
// from there (ref_wire_id). Set around every encoding: a call's arguments, a spawn's constructor
// arguments, a result a host sends back over a link.
class RemoteArgs {
 public:
  explicit RemoteArgs(bool crossing);
  ~RemoteArgs();
  RemoteArgs(const RemoteArgs&) = delete;
  RemoteArgs& operator=(const RemoteArgs&) = delete;

 private:
  bool previous_;
};

// Decodes the arguments, runs the method on `self`, encodes its result. Throws DecodeError for
// bad arguments; the method's own exceptions pass through.
using Invoker = std::function<Payload(void* self, const Payload& args)>;
// The same for a method that answers later (it returns a Future): the encoded result's future.
// `crossing`: the result goes to another process (RemoteArgs, set on the thread that encodes it).
using DeferredInvoker = std::function<Future<Payload>(void* self, const Payload& args, bool crossing)>;
using Factory = void* (*)(const Payload& ctor_args);   // throws DecodeError or the ctor's exception
using Destroyer = void (*)(void*);

struct MethodInfo {
  std::string name;
  Invoker invoke;                    // one of the two is set
  DeferredInvoker invoke_deferred;   // for methods returning Future<R>
};

struct ActorTypeInfo {
  std::string name;
  std::vector<MethodInfo> methods;
  std::map<std::string, Factory> factories;   // by constructor signature key
  Destroyer destroy = nullptr;

  const MethodInfo* find_method(std::string_view method) const;
  Factory find_factory(const std::string& signature) const;
};

class Registry {
 public:
  static Registry& instance();
  ActorTypeInfo& type(const std::string& name);            // creates on first use
  const ActorTypeInfo* find(std::string_view name) const { return types_.find(name); }   // null if unknown

 private:
  NamedRegistry<ActorTypeInfo> types_{"actor type"};
};

// Specialised by TROUPE_ACTOR for each registered type.
template <class T>
struct ActorTraits {
  static constexpr bool registered = false;
};

template <class T, class M, std::size_t... I>
Payload invoke_method(M m, T& obj, const Payload& in, std::index_sequence<I...>) {
  using Tr = MethodTraits<M>;
  auto args = TupleDecoder<typename Tr::Values>::decode(in);
  using R = typename Tr::Result;
  if constexpr (std::is_void_v<R>) {
    (obj.*m)(std::forward<std::tuple_element_t<I, typename Tr::Params>>(std::get<I>(args))...);
    return encode_value(msgpack::type::nil_t{});
  } else {
    return encode_value((obj.*m)(std::forward<std::tuple_element_t<I, typename Tr::Params>>(std::get<I>(args))...));
  }
}

template <class T, class M, std::size_t... I>
Future<Payload> invoke_deferred_method(M m, T& obj, const Payload& in, bool crossing, std::index_sequence<I...>) {
  using Tr = MethodTraits<M>;
  [[maybe_unused]] auto args = TupleDecoder<typename Tr::Values>::decode(in);   // unused by a method of no arguments
  using R = typename Tr::Result;
  Future<R> f = (obj.*m)(std::forward<std::tuple_element_t<I, typename Tr::Params>>(std::get<I>(args))...);
  if (!f.valid()) return make_error_future<Payload>(Error{ErrorCode::Internal, "the method returned no future"});
  if constexpr (std::is_void_v<R>) {
    return f.then([] { return encode_value(msgpack::type::nil_t{}); });
  } else {
    return f.then([crossing](R& v) {   // on the thread that completes f
      RemoteArgs c(crossing);
      return encode_value(v);
    });
  }
}

template <class T, class M>
MethodInfo make_method(const char* name, M m) {
  if constexpr (MethodTraits<M>::deferred) {
    return MethodInfo{name, nullptr, [m](void* self, const Payload& in, bool crossing) {
                        return invoke_deferred_method<T>(m, *static_cast<T*>(self), in, crossing,
                                                         std::make_index_sequence<MethodTraits<M>::arity>{});
                      }};
  } else {
    return MethodInfo{name, [m](void* self, const Payload& in) {
                        return invoke_method<T>(m, *static_cast<T*>(self), in,
                                                std::make_index_sequence<MethodTraits<M>::arity>{});
                      }, nullptr};
  }
}

template <class T, class Tuple, std::size_t... I>
std::vector<MethodInfo> make_methods(const Tuple& entries, std::index_sequence<I...>) {
  return {make_method<T>(std::get<I>(entries).first, std::get<I>(entries).second)...};
}

template <class T>
bool register_actor_type() {
  auto& info = Registry::instance().type(ActorTraits<T>::name());
  auto entries = ActorTraits<T>::methods();
  info.methods = make_methods<T>(entries, std::make_index_sequence<std::tuple_size_v<decltype(entries)>>{});
  info.destroy = [](void* p) { delete static_cast<T*>(p); };
  return true;
}

template <class A, class B>
bool same_method(A a, B b) {
  if constexpr (std::is_same_v<A, B>) return a == b; else return false;
}

// The name a member function pointer was registered under, or nullptr.
template <class T, class M>
const char* method_name(M m) {
  const char* found = nullptr;
  std::apply([&](const auto&... e) {
    ((found = (found == nullptr && same_method(e.second, m)) ? e.first : found), ...);
  }, ActorTraits<T>::methods());
  return found;
}

// Constructor registration: one factory per (type, decoded argument types). Instantiated by
// spawn<T>(args...), registered at static initialisation so a worker process (which never runs
// the spawning code) can construct the actor too.
template <class T, class... A>
struct CtorFactory {
  static std::string signature() { return typeid(std::tuple<A...>).name(); }
  static void* make(const Payload& p) {
    auto args = decode_args<A...>(p);
    return std::apply([](auto&... a) { return static_cast<void*>(new T(std::move(a)...)); }, args);
  }
  static bool add() {
    Registry::instance().type(ActorTraits<T>::name()).factories[signature()] = &make;
    return true;
  }
  static inline const bool registered = add();
};

}  // namespace troupe::detail

// --- TROUPE_ACTOR(Type, method...) -----------------------------------------------------------------
// Use at global namespace scope, once per type, after the class definition. Overloaded methods
// cannot be registered (name them distinctly). A method may return troupe::Future<R> to answer
// later (a deferred reply): its callers' futures hold R and complete when the returned future
// does, on whatever thread completes it; the actor goes on to its next call meanwhile, so such
// replies may overtake earlier ones. If the actor stops first, the call fails with ActorDied.
#define TROUPE_DETAIL_M(T, m) std::make_pair(#m, &T::m)
#define TROUPE_DETAIL_EXPAND(x) x
#define TROUPE_DETAIL_FE_1(T, a) TROUPE_DETAIL_M(T, a)
#define TROUPE_DETAIL_FE_2(T, a, ...) TROUPE_DETAIL_M(T, a), TROUPE_DETAIL_EXPAND(TROUPE_DETAIL_FE_1(T, __VA_ARGS__))
#define TROUPE_DETAIL_FE_3(T, a, ...) TROUPE_DETAIL_M(T, a), TROUPE_DETAIL_EXPAND(TROUPE_DETAIL_FE_2(T, __VA_ARGS__))
#define TROUPE_DETAIL_FE_4(T, a, ...) TROUPE_DETAIL_M(T, a), TROUPE_DETAIL_EXPAND(TROUPE_DETAIL_FE_3(T, __VA_ARGS__))
#define TROUPE_DETAIL_FE_5(T, a, ...) TROUPE_DETAIL_M(T, a), TROUPE_DETAIL_EXPAND(TROUPE_DETAIL_FE_4(T, __VA_ARGS__))
#define TROUPE_DETAIL_FE_6(T, a, ...) TROUPE_DETAIL_M(T, a), TROUPE_DETAIL_EXPAND(TROUPE_DETAIL_FE_5(T, __VA_ARGS__))
#define TROUPE_DETAIL_FE_7(T, a, ...) TROUPE_DETAIL_M(T, a), TROUPE_DETAIL_EXPAND(TROUPE_DETAIL_FE_6(T, __VA_ARGS__))
#define TROUPE_DETAIL_FE_8(T, a, ...) TROUPE_DETAIL_M(T, a), TROUPE_DETAIL_EXPAND(TROUPE_DETAIL_FE_7(T, __VA_ARGS__))
#define TROUPE_DETAIL_FE_9(T, a, ...) TROUPE_DETAIL_M(T, a), TROUPE_DETAIL_EXPAND(TROUPE_DETAIL_FE_8(T, __VA_ARGS__))
#define TROUPE_DETAIL_FE_10(T, a, ...) TROUPE_DETAIL_M(T, a), TROUPE_DETAIL_EXPAND(TROUPE_DETAIL_FE_9(T, __VA_ARGS__))
#define TROUPE_DETAIL_FE_11(T, a, ...) TROUPE_DETAIL_M(T, a), TROUPE_DETAIL_EXPAND(TROUPE_DETAIL_FE_10(T, __VA_ARGS__))
#define TROUPE_DETAIL_FE_12(T, a, ...) TROUPE_DETAIL_M(T, a), TROUPE_DETAIL_EXPAND(TROUPE_DETAIL_FE_11(T, __VA_ARGS__))
#define TROUPE_DETAIL_FE_13(T, a, ...) TROUPE_DETAIL_M(T, a), TROUPE_DETAIL_EXPAND(TROUPE_DETAIL_FE_12(T, __VA_ARGS__))
#define TROUPE_DETAIL_FE_14(T, a, ...) TROUPE_DETAIL_M(T, a), TROUPE_DETAIL_EXPAND(TROUPE_DETAIL_FE_13(T, __VA_ARGS__))
#define TROUPE_DETAIL_FE_15(T, a, ...) TROUPE_DETAIL_M(T, a), TROUPE_DETAIL_EXPAND(TROUPE_DETAIL_FE_14(T, __VA_ARGS__))
#define TROUPE_DETAIL_FE_16(T, a, ...) TROUPE_DETAIL_M(T, a), TROUPE_DETAIL_EXPAND(TROUPE_DETAIL_FE_15(T, __VA_ARGS__))
#define TROUPE_DETAIL_PICK(_1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13, _14, _15, _16, N, ...) N
#define TROUPE_DETAIL_FOR_EACH(T, ...)                                                                      \
  TROUPE_DETAIL_EXPAND(TROUPE_DETAIL_PICK(__VA_ARGS__, TROUPE_DETAIL_FE_16, TROUPE_DETAIL_FE_15,            \
      TROUPE_DETAIL_FE_14, TROUPE_DETAIL_FE_13, TROUPE_DETAIL_FE_12, TROUPE_DETAIL_FE_11, TROUPE_DETAIL_FE_10, \
      TROUPE_DETAIL_FE_9, TROUPE_DETAIL_FE_8, TROUPE_DETAIL_FE_7, TROUPE_DETAIL_FE_6, TROUPE_DETAIL_FE_5,     \
      TROUPE_DETAIL_FE_4, TROUPE_DETAIL_FE_3, TROUPE_DETAIL_FE_2, TROUPE_DETAIL_FE_1)(T, __VA_ARGS__))
#define TROUPE_DETAIL_CAT2(a, b) a##b
#define TROUPE_DETAIL_CAT(a, b) TROUPE_DETAIL_CAT2(a, b)

#define TROUPE_ACTOR(Type, ...)                                                               \
  template <>                                                                                 \
  struct troupe::detail::ActorTraits<Type> {                                                  \
    static constexpr bool registered = true;                                                  \
    static const char* name() { return #Type; }                                               \
    static auto methods() { return std::make_tuple(TROUPE_DETAIL_FOR_EACH(Type, __VA_ARGS__)); } \
  };                                                                                          \
  static const bool TROUPE_DETAIL_CAT(troupe_actor_registered_, __COUNTER__) =                \
      troupe::detail::register_actor_type<Type>()
