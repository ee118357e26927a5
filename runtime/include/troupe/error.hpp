// Errors are values. Every failed call resolves its future with an Error carrying one of these
// codes; each code's comment says whether retrying the same call can help.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace troupe {

enum class ErrorCode : int {
  Ok = 0,
  ActorDied,      // the actor stopped (killed, constructor threw, process/node died). Retry: only after a restart.
  Timeout,        // the call's deadline passed. The actor may still run it. Retry: yes if idempotent.
  Unavailable,    // the runtime or cluster cannot take the call now (shut down, no node). Retry: later.
  BadArguments,   // arguments or result did not encode/decode, or no such method. Retry: never.
  MethodFailed,   // the method threw; the message is its what(). Retry: depends on the method.
  Cancelled,      // the caller gave up (e.g. group call aborted). Retry: yes.
  Internal,       // a bug in troupe. Retry: no.
};

std::string_view to_string(ErrorCode code);

struct Error {
  ErrorCode code = ErrorCode::Internal;
  std::string message;

  std::string to_string() const;   // "ActorDied: actor Counter#3 was killed"
};

// Thrown by Future<T>::get() when the call failed; carries the Error.
class CallError : public std::runtime_error {
 public:
  explicit CallError(Error e) : std::runtime_error(e.to_string()), error_(std::move(e)) {}
  const Error& error() const noexcept { return error_; }
  ErrorCode code() const noexcept { return error_.code; }

 private:
  Error error_;
};

// A value or an Error. Used where throwing is not wanted (Future<T>::result()).
template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::in_place_index<0>, std::move(value)) {}
  Result(Error error) : v_(std::in_place_index<1>, std::move(error)) {}

  bool ok() const noexcept { return v_.index() == 0; }
  explicit operator bool() const noexcept { return ok(); }
  T& value() & { check(); return std::get<0>(v_); }
  T&& value() && { check(); return std::get<0>(std::move(v_)); }
  const Error& error() const { return std::get<1>(v_); }

 private:
  void check() const { if (!ok()) throw CallError(std::get<1>(v_)); }
  std::variant<T, Error> v_;
};

template <>
class [[nodiscard]] Result<void> {
 public:
  Result() = default;
  Result(Error error) : error_(std::move(error)), ok_(false) {}
  bool ok() const noexcept { return ok_; }
  explicit operator bool() const noexcept { return ok_; }
  void value() const { if (!ok_) throw CallError(error_); }
  const Error& error() const { return error_; }

 private:
  Error error_;
  bool ok_ = true;
};

}  // namespace troupe
