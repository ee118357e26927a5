// Errors are values, one type for all of troupe. An Error is a Code — a domain (the library that
// reports it) and that domain's code — and a message. It crosses actor boundaries intact: a
// method that throws ErrorException(e) fails its caller's future with exactly `e`, in-process or
// from another node, and callers compare codes, never message text. Each code's comment says
// whether retrying the same operation can help.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace troupe {

enum class ErrorDomain : std::uint8_t { Core = 0, Placement, Kernels, Transport, Weights, Control, Net };

// Core: what became of an actor call.
enum class ErrorCode : std::uint16_t {
  Ok = 0,
  ActorDied,      // the actor stopped (killed, constructor threw, process/node died). Retry: only after a restart.
  Timeout,        // the call's deadline passed. The actor may still run it. Retry: yes if idempotent.
  Unavailable,    // the runtime or cluster cannot take the call now (shut down, no node). Retry: later.
  BadArguments,   // arguments or result did not encode/decode, or no such method. Retry: never.
  MethodFailed,   // the method threw; the message is its what(). Retry: depends on the method.
  Cancelled,      // the caller gave up (e.g. group call aborted). Retry: yes.
  Internal,       // a bug in troupe. Retry: no.
};

// placement/: resources, placement groups, the scheduler.
enum class PlacementCode : std::uint16_t {
  InvalidArgument = 1,  // the request is malformed (bad resource string, empty bundle, 1.5 GPU). Retry: never.
  NotFound,             // an id names no live node, group, bundle or actor. Retry: never.
  AlreadyExists,        // the id is taken (a node added twice, or dead: FT-3). Retry: never.
  Infeasible,           // no node could ever hold it, even empty. Retry: only after a larger node joins.
  Unavailable,          // it fits the cluster's totals but not what is free now. Retry: after releases.
  FailedPrecondition,   // the target is in the wrong state (group pending, node draining). Retry: after it changes.
};

// kernels/: the plain-buffer RL math.
enum class KernelCode : std::uint16_t {
  BadArguments = 1,     // a size, pointer or option is invalid. Retry: never.
  Unavailable,          // built without CUDA, or no usable device. Retry: no; the CPU twin can serve.
  DeviceError,          // a CUDA call failed (launch, allocation, copy); the message has CUDA's text. Retry: maybe.
};

// transport/: tensors over the data plane.
enum class TransportCode : std::uint16_t {
  BadDescriptor = 1,    // descriptor bytes do not decode, or describe an impossible tensor. Retry: never.
  PeerGone,             // the exposing process is unreachable or died. Retry: no; its actor may restart.
  Timeout,              // the fetch's deadline passed. Retry: yes.
  Released,             // this process no longer exposes the region. Retry: no (a bug or a late fetch).
  Ucx,                  // any other UCX failure (the message names UCX's status). Retry: later.
};

// weights/: the versioned weight store.
enum class WeightCode : std::uint16_t {
  NotFound = 1,         // no such version here (never published, or freed). Retry: ask for the latest.
  Checksum,             // the bytes received do not match the publisher's checksum (WS-1). Retry: yes.
  Transfer,             // a publisher or relay is unreachable, or the pull timed out. Retry: yes, or another source.
  Rejoin,               // an NCCL group was formed anew or broke since the member joined. Retry: join again.
};

// control/: the head, its store and the node daemons.
enum class ControlCode : std::uint16_t {
  Store = 1,            // the head's store could not be opened, read or written. Retry: no (disk, permissions).
  BadRequest,           // a request to the head is malformed: a field missing, of the wrong type or out of range. Retry: never.
  NotFound,             // the request names no node, worker, actor or placement group the head knows. Retry: never.
  Conflict,             // the target's state forbids it (colocating with an actor that is not running). Retry: after it changes.
  TooLarge,             // a body over the head's bound (a job package over its size limit). Retry: never, as it is.
};

// net/: what troupe processes speak to each other.
enum class NetCode : std::uint16_t {
  Unreachable = 1,      // the peer cannot be reached, or the exchange did not finish in time. Retry: later.
  Refused,              // the peer refused the handshake (wrong token), or is no troupe process. Retry: never.
};

template <class E>
struct DomainOf;   // the domain of each code enum above
template <> struct DomainOf<ErrorCode> { static constexpr ErrorDomain value = ErrorDomain::Core; };
template <> struct DomainOf<PlacementCode> { static constexpr ErrorDomain value = ErrorDomain::Placement; };
template <> struct DomainOf<KernelCode> { static constexpr ErrorDomain value = ErrorDomain::Kernels; };
template <> struct DomainOf<TransportCode> { static constexpr ErrorDomain value = ErrorDomain::Transport; };
template <> struct DomainOf<WeightCode> { static constexpr ErrorDomain value = ErrorDomain::Weights; };
template <> struct DomainOf<ControlCode> { static constexpr ErrorDomain value = ErrorDomain::Control; };
template <> struct DomainOf<NetCode> { static constexpr ErrorDomain value = ErrorDomain::Net; };

template <class E>
concept DomainCode = requires { DomainOf<E>::value; };

// A code of any domain. Any code enum converts to it, so `error.code == ErrorCode::Timeout` and
// `error.code == WeightCode::NotFound` both read as they should.
class Code {
 public:
  constexpr Code() = default;   // Core Internal
  template <DomainCode E>
  constexpr Code(E code) noexcept : domain_(DomainOf<E>::value), value_(static_cast<std::uint16_t>(code)) {}   // NOLINT
  // A code read from outside bytes; a pair no domain defines becomes Core Internal.
  static Code from_wire(std::uint8_t domain, std::uint16_t value) noexcept;

  constexpr ErrorDomain domain() const noexcept { return domain_; }
  constexpr std::uint16_t value() const noexcept { return value_; }
  friend constexpr bool operator==(Code, Code) noexcept = default;

 private:
  ErrorDomain domain_ = ErrorDomain::Core;
  std::uint16_t value_ = static_cast<std::uint16_t>(ErrorCode::Internal);
};

std::string_view to_string(ErrorDomain domain);   // "core", "weights", ...
std::string_view to_string(ErrorCode code);       // "ActorDied"
std::string to_string(Code code);                 // "ActorDied" (core), "weights.NotFound"

struct Error {
  Code code;
  std::string message;

  std::string to_string() const;   // "ActorDied: actor Counter#3 was killed"
};

// Throw from anywhere, an actor method included: the caller's future fails with exactly `error`.
class ErrorException : public std::runtime_error {
 public:
  explicit ErrorException(Error e) : std::runtime_error(e.to_string()), error_(std::move(e)) {}
  const Error& error() const noexcept { return error_; }
  Code code() const noexcept { return error_.code; }

 private:
  Error error_;
};

// Thrown by Future<T>::get() and Result<T>::value(): a call or an operation this code made failed
// with error(). One that escapes an actor method fails that method's caller with MethodFailed
// naming it (a nested call's ActorDied is not the callee's death).
class CallError : public ErrorException {
 public:
  using ErrorException::ErrorException;
};

// A value or an Error. Reading value() of an error throws CallError carrying it.
template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::in_place_index<0>, std::move(value)) {}   // NOLINT: implicit by design
  Result(Error error) : v_(std::in_place_index<1>, std::move(error)) {}   // NOLINT
  Result(Code code, std::string message) : Result(Error{code, std::move(message)}) {}

  bool ok() const noexcept { return v_.index() == 0; }
  explicit operator bool() const noexcept { return ok(); }
  T& value() & { check(); return std::get<0>(v_); }
  const T& value() const& { check(); return std::get<0>(v_); }
  T&& value() && { check(); return std::get<0>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  const Error& error() const { return std::get<1>(v_); }   // valid when !ok()

 private:
  void check() const { if (!ok()) throw CallError(std::get<1>(v_)); }
  std::variant<T, Error> v_;
};

template <>
class [[nodiscard]] Result<void> {
 public:
  Result() = default;
  Result(Error error) : error_(std::move(error)), ok_(false) {}   // NOLINT
  Result(Code code, std::string message) : Result(Error{code, std::move(message)}) {}
  bool ok() const noexcept { return ok_; }
  explicit operator bool() const noexcept { return ok_; }
  void value() const { if (!ok_) throw CallError(error_); }
  const Error& error() const { return error_; }   // valid when !ok()

 private:
  Error error_;
  bool ok_ = true;
};

// The outcome of an operation with no value: ok, or an Error.
using Status = Result<void>;

}  // namespace troupe

// Returns the error from the enclosing function (whose result is any Result or Status) when
// `expr`, a Result or Status, holds one.
#define TROUPE_RETURN_IF_ERROR(expr)                                  \
  do {                                                                \
    if (auto&& troupe_result_ = (expr); !troupe_result_.ok()) {       \
      return ::troupe::Error(troupe_result_.error());                 \
    }                                                                 \
  } while (0)
