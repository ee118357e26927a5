// Errors as values for the placement module: Status and Result<T>.
//
// Every fallible call of the module returns one of these; none throws (the one documented
// exception is Resources::must_parse). Each StatusCode says whether a retry can help.
#pragma once

#include <stdexcept>
#include <string>
#include <utility>
#include <variant>

namespace troupe::placement {

enum class StatusCode {
  kOk = 0,
  // The request is malformed (bad resource string, empty bundle, 1.5 GPU). Retrying never helps.
  kInvalidArgument,
  // An id names no live node, group, bundle or actor. Retrying never helps.
  kNotFound,
  // The id is taken (node already added or dead: FT-3; actor already placed).
  kAlreadyExists,
  // Nothing in the cluster as it is could ever hold the request, even with every node empty.
  // Retrying helps only after a larger node joins.
  kInfeasible,
  // The request fits the cluster's totals but not what is free now. Retry after releases.
  kUnavailable,
  // The target is in the wrong state (group pending, node draining). Retry after it changes.
  kFailedPrecondition,
};

// Stable name of a code, e.g. "Infeasible".
const char* to_string(StatusCode code);

// The outcome of an operation: ok, or a code with a human-readable message.
class [[nodiscard]] Status {
 public:
  Status() = default;  // ok
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return {}; }
  bool is_ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "Infeasible: no node can ever hold bundle 0 {GPU=16}"; "OK" when ok.
  std::string to_string() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// A value or an error Status. Reading value() of an error is a programming error and throws
// std::logic_error carrying the status message.
template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : state_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status error) : state_(std::move(error)) {  // NOLINT: implicit by design
    if (std::get<Status>(state_).is_ok())
      state_ = Status(StatusCode::kInvalidArgument, "Result built from an ok Status");
  }

  bool is_ok() const { return std::holds_alternative<T>(state_); }
  // The error, or an ok Status when a value is held.
  Status status() const { return is_ok() ? Status::ok() : std::get<Status>(state_); }

  const T& value() const& { check(); return std::get<T>(state_); }
  T& value() & { check(); return std::get<T>(state_); }
  T&& value() && { check(); return std::get<T>(std::move(state_)); }
  const T* operator->() const { return &value(); }
  T* operator->() { return &value(); }
  const T& operator*() const& { return value(); }
  T& operator*() & { return value(); }

 private:
  void check() const {
    if (!is_ok()) throw std::logic_error("Result::value() on error: " + status().to_string());
  }
  std::variant<T, Status> state_;
};

}  // namespace troupe::placement
