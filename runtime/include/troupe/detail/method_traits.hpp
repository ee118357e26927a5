// Compile-time facts about a member function pointer: its class, result and parameters.
#pragma once

#include <tuple>
#include <type_traits>

namespace troupe {
template <class T>
class Future;
}  // namespace troupe

namespace troupe::detail {

// What a call of a method returning R resolves with. A method that returns Future<V> answers
// later (a deferred reply): its caller's future holds V, and resolves when the method's does.
template <class R>
struct ReplyOf {
  using type = R;
  static constexpr bool deferred = false;
};
template <class V>
struct ReplyOf<Future<V>> {
  using type = V;
  static constexpr bool deferred = true;
};

template <class M>
struct MethodTraits;

template <class C, class R, class... A>
struct MethodTraits<R (C::*)(A...)> {
  using Class = C;
  using Result = typename ReplyOf<R>::type;      // what a call's future holds (R, or V of Future<V>)
  static constexpr bool deferred = ReplyOf<R>::deferred;
  using Params = std::tuple<A...>;                    // as declared
  using Values = std::tuple<std::decay_t<A>...>;      // as carried on the wire
  static constexpr std::size_t arity = sizeof...(A);
};
template <class C, class R, class... A>
struct MethodTraits<R (C::*)(A...) const> : MethodTraits<R (C::*)(A...)> {};
template <class C, class R, class... A>
struct MethodTraits<R (C::*)(A...) noexcept> : MethodTraits<R (C::*)(A...)> {};
template <class C, class R, class... A>
struct MethodTraits<R (C::*)(A...) const noexcept> : MethodTraits<R (C::*)(A...)> {};

// The type an argument travels as: decayed, with C strings as std::string.
template <class A>
struct WireType { using type = std::decay_t<A>; };
template <>
struct WireType<const char*> { using type = std::string; };
template <>
struct WireType<char*> { using type = std::string; };
template <class A>
using wire_t = typename WireType<std::decay_t<A>>::type;

}  // namespace troupe::detail
