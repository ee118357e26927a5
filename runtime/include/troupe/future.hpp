// Future<T>: the eventual result of a call. Copyable handle to one shared state; every future
// resolves, with a value or an Error, and never waits on a dead actor (FT-1).
#pragma once

#include <chrono>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "troupe/detail/state.hpp"
#include "troupe/error.hpp"

namespace troupe {

template <class T>
class Future;

template <class T>
class Promise {
 public:
  Promise() : state_(std::make_shared<detail::State<T>>()) {}
  Future<T> future() const { return Future<T>(state_); }
  template <class U = T, class = std::enable_if_t<!std::is_void_v<U>>>
  bool set_value(U v) const { return state_->set_value(std::move(v)); }
  template <class U = T, class = std::enable_if_t<std::is_void_v<U>>>
  bool set_value() const { return state_->set_value(detail::Unit{}); }
  bool set_error(Error e) const { return state_->fail(std::move(e)); }
  const std::shared_ptr<detail::State<T>>& state() const { return state_; }

 private:
  std::shared_ptr<detail::State<T>> state_;
};

template <class T>
class Future {
 public:
  using value_type = T;

  Future() = default;   // invalid until assigned
  explicit Future(std::shared_ptr<detail::State<T>> s) : state_(std::move(s)) {}

  bool valid() const noexcept { return state_ != nullptr; }
  bool ready() const { return state_->ready(); }
  void wait() const { state_->wait(); }
  // True if the future completed within `d`.
  template <class Rep, class Period>
  bool wait_for(std::chrono::duration<Rep, Period> d) const {
    return state_->wait_until(std::chrono::steady_clock::now() + d);
  }

  // Blocks, then returns the value or throws CallError. An rvalue future moves the value out.
  decltype(auto) get() const& {
    wait();
    if (state_->has_error()) throw CallError(state_->error());
    if constexpr (std::is_void_v<T>) return; else return static_cast<const T&>(state_->value());
  }
  T get() && {
    wait();
    if (state_->has_error()) throw CallError(state_->error());
    if constexpr (!std::is_void_v<T>) return std::move(state_->value());
  }
  // Blocks, then returns the value or the error without throwing.
  Result<T> result() const {
    wait();
    if (state_->has_error()) return Result<T>(state_->error());
    if constexpr (std::is_void_v<T>) return Result<T>(); else return Result<T>(state_->value());
  }

  // Chains f on the value: Future<U> where U = f(T). An error skips f and propagates; an
  // ErrorException thrown by f fails the result with its Error, any other exception with
  // ErrorCode::MethodFailed. f runs on the completing thread.
  template <class F>
  auto then(F f) const;

  const std::shared_ptr<detail::State<T>>& state() const { return state_; }

 private:
  std::shared_ptr<detail::State<T>> state_;
};

namespace detail {
template <class F, class T>
struct ThenResult { using type = std::invoke_result_t<F, T&>; };
template <class F>
struct ThenResult<F, void> { using type = std::invoke_result_t<F>; };
}  // namespace detail

template <class T>
template <class F>
auto Future<T>::then(F f) const {
  using R = typename detail::ThenResult<F, T>::type;
  Promise<R> p;
  // The callback lives in the source's state, so it holds that state weakly: a source that never
  // completes (its actor gone) is then freed with its callback, not kept alive by it.
  std::weak_ptr<detail::State<T>> weak = state_;
  state_->on_ready([weak, p, f = std::move(f)]() mutable {
    auto src = weak.lock();   // the completing thread holds it (StateBase::on_ready)
    if (!src) { p.set_error(Error{ErrorCode::Internal, "then: the source was freed as it completed"}); return; }
    if (src->has_error()) { p.set_error(src->error()); return; }
    try {
      if constexpr (std::is_void_v<T> && std::is_void_v<R>) { f(); p.set_value(); }
      else if constexpr (std::is_void_v<T>) { p.set_value(f()); }
      else if constexpr (std::is_void_v<R>) { f(src->value()); p.set_value(); }
      else { p.set_value(f(src->value())); }
    } catch (const ErrorException& e) {   // f's own Error, or a CallError of a call it made
      p.set_error(e.error());
    } catch (const std::exception& e) {
      p.set_error(Error{ErrorCode::MethodFailed, e.what()});
    }
  });
  return p.future();
}

template <class T>
Future<T> make_ready_future(T v) { Promise<T> p; p.set_value(std::move(v)); return p.future(); }
inline Future<void> make_ready_future() { Promise<void> p; p.set_value(); return p.future(); }
template <class T>
Future<T> make_error_future(Error e) { Promise<T> p; p.set_error(std::move(e)); return p.future(); }

// Blocks until every future has completed (value or error).
template <class... Fs>
void wait_all(const Fs&... fs) { (fs.wait(), ...); }
template <class T>
void wait_all(const std::vector<Future<T>>& fs) { for (auto& f : fs) f.wait(); }

namespace detail {
// Blocks until one of `states` completes; returns its index. Empty input returns 0.
std::size_t wait_any_state(const std::vector<StateBase*>& states);
}  // namespace detail

// Blocks until one future completes and returns its index.
template <class T>
std::size_t wait_any(const std::vector<Future<T>>& fs) {
  std::vector<detail::StateBase*> states;
  states.reserve(fs.size());
  for (auto& f : fs) states.push_back(f.state().get());
  return detail::wait_any_state(states);
}

// One future for many: the values in order, or the first error by index once all completed.
template <class T>
Future<std::conditional_t<std::is_void_v<T>, void, std::vector<T>>> when_all(std::vector<Future<T>> fs);

// One future for many that never fails: each input's value or error, in order, once all completed.
template <class T>
Future<std::vector<Result<T>>> when_all_results(std::vector<Future<T>> fs);

}  // namespace troupe

#include "troupe/detail/when_all.hpp"
