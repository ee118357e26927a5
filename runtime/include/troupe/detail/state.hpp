// The shared state behind a Future: completed exactly once, with a value or an Error.
// Thread-safe: any thread may complete it, wait on it or attach callbacks.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <functional>
#include <mutex>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "troupe/codec.hpp"
#include "troupe/error.hpp"

namespace troupe::detail {

struct Unit {};   // the stored value of a void future
template <class T>
using Stored = std::conditional_t<std::is_void_v<T>, Unit, T>;

class StateBase;
struct CallRecord;   // a call's attempts on remote routes (actor_cell.cpp)
struct CallRecordDeleter {
  void operator()(CallRecord* r) const noexcept;
};

// Bookkeeping for a state that is the result of an actor call in flight: the links of the
// actor's list of calls in flight and the call's deadline. Owned and guarded by that actor's
// ActorCell (the call table); kept here so a call to a local actor costs one allocation, not two.
struct CallLink {
  StateBase* prev = nullptr;
  StateBase* next = nullptr;
  std::shared_ptr<StateBase> self;   // set while linked: the list's reference
  std::pair<std::chrono::steady_clock::time_point, std::uint64_t> deadline{};
  bool has_deadline = false;
  std::uint64_t seq = 0;             // per actor, in submission order
  // Set for calls that were queued or sent on a remote route: what is needed to send them again.
  std::unique_ptr<CallRecord, CallRecordDeleter> record;
};

class StateBase {
 public:
  StateBase() = default;
  StateBase(const StateBase&) = delete;
  StateBase& operator=(const StateBase&) = delete;
  virtual ~StateBase() = default;

  bool ready() const noexcept { return status_.load(std::memory_order_acquire) >= kValue; }
  bool has_error() const noexcept { return status_.load(std::memory_order_acquire) == kError; }
  const Error& error() const { return error_; }   // valid once has_error()

  void wait();
  bool wait_until(std::chrono::steady_clock::time_point deadline);

  // Fails the state unless it is already complete. Returns whether this call completed it.
  bool fail(Error e);
  // Completes from a call's reply bytes (decodes the value). Same return contract as fail().
  virtual bool complete_from(const Payload& reply) = 0;

  // Runs `cb` once the state completes: at once (on this thread) if it already has, else on
  // the completing thread. Callbacks must be short and must not block. Whoever completes a state
  // holds a shared_ptr to it until the call returns (a Promise, a call table's entry): callbacks
  // hold their own state weakly (Future::then, when_all) and find it alive through that one.
  void on_ready(std::function<void()> cb);

  CallLink call_link;   // see CallLink; untouched by futures that are not calls

  // The call went to another process: a waiter takes its reply from this process's lanes itself
  // and sleeps where they wake it (see wait()), rather than waiting for a thread to hand it over.
  void mark_remote() noexcept { remote_.store(true, std::memory_order_relaxed); }
  // The reply is expected about `at` (its call table's average for the method): a waiter sleeps
  // until shortly before and then looks for it, so that no sleeping thread has to be woken when
  // it comes (see wait()).
  void expect_reply(std::chrono::steady_clock::time_point at) noexcept {
    expected_ns_.store(at.time_since_epoch().count(), std::memory_order_relaxed);
  }

 protected:
  static constexpr int kPending = 0, kCompleting = 1, kValue = 2, kError = 3;
  bool begin_complete() noexcept {
    int expected = kPending;
    return status_.compare_exchange_strong(expected, kCompleting, std::memory_order_acq_rel);
  }
  void finish_complete(int status);

 private:
  bool await_remote(std::chrono::steady_clock::time_point deadline);   // state.cpp

  std::atomic<int> status_{kPending};
  std::atomic<bool> remote_{false};
  std::atomic<std::chrono::steady_clock::rep> expected_ns_{0};   // expect_reply's, 0: none
  Error error_;
  std::mutex mu_;
  std::condition_variable cv_;
  int waiters_ = 0;
  int lane_sleepers_ = 0;               // mu_: waiters asleep on bell_ (and the lanes) rather than cv_
  std::atomic<std::uint32_t> bell_{0};  // bumped when the state completes with lane sleepers
  std::vector<std::function<void()>> callbacks_;
};

template <class T>
class State final : public StateBase {
 public:
  using Value = Stored<T>;

  bool set_value(Value v) {
    if (!begin_complete()) return false;
    value_.emplace(std::move(v));
    finish_complete(kValue);
    return true;
  }

  bool complete_from(const Payload& reply) override {
    if constexpr (std::is_void_v<T>) {
      return set_value(Unit{});
    } else if constexpr (std::is_same_v<T, Payload>) {   // the encoded result itself
      return set_value(reply);
    } else {
      Value v;
      try {
        v = decode_value<Value>(reply);
      } catch (const DecodeError& e) {
        return fail(Error{ErrorCode::BadArguments, "result did not decode: " + e.error().message});
      } catch (const std::exception& e) {
        return fail(Error{ErrorCode::BadArguments, std::string("result did not decode: ") + e.what()});
      }
      return set_value(std::move(v));
    }
  }

  Value& value() { return *value_; }   // valid once ready() && !has_error()

 private:
  std::optional<Value> value_;
};

}  // namespace troupe::detail
