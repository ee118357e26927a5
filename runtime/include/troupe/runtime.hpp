// The Runtime owns one actor system per process: it spawns, kills and shuts down actors.
// troupe::init(argc, argv) builds one from flags and TROUPE_* environment variables.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "troupe/actor_ref.hpp"
#include "troupe/options.hpp"
#include "troupe/registry.hpp"

namespace troupe {

// Flags (highest precedence), then environment, then these defaults.
struct RuntimeConfig {
  int threads = 0;                            // --troupe-threads / TROUPE_THREADS: scheduler threads (0 = cores)
  std::string log_level = "warn";             // --troupe-log-level / TROUPE_LOG_LEVEL: trace..off
  std::chrono::milliseconds call_timeout{0};  // --troupe-call-timeout-ms / TROUPE_CALL_TIMEOUT_MS: 0 = none
  // --troupe-remote-call-timeout-ms / TROUPE_REMOTE_CALL_TIMEOUT_MS: the deadline of a call to an
  // actor in a worker process when neither the call nor the actor sets one (FT-1: never infinite).
  std::chrono::milliseconds remote_call_timeout{120000};
  // --address / TROUPE_ADDRESS: the head ("host:port") of a cluster started with `troupe start`.
  // Empty: actors that need a process get an embedded head and node inside this process.
  std::string address;
  // --troupe-token / TROUPE_TOKEN, or --troupe-token-file / TROUPE_TOKEN_FILE: the cluster token.
  // Empty with an address: the token file of this machine's latest session.
  std::string token;
  std::string session_root = "/tmp/troupe";   // TROUPE_TMPDIR: where session directories go

  // Reads the TROUPE_* environment. Throws std::invalid_argument naming the bad variable.
  static RuntimeConfig from_env();
  // Applies --troupe-* flags over `base`; leaves every other argument alone. Throws
  // std::invalid_argument naming the bad flag.
  static RuntimeConfig from_args(int argc, const char* const* argv, RuntimeConfig base);
  // Flags over the environment, as troupe::init reads them: a flag wins over its variable, and
  // only the value in force is checked (a bad TROUPE_THREADS is no error under --troupe-threads).
  // Throws std::invalid_argument naming the flag or variable the bad value came from.
  static RuntimeConfig from_args_and_env(int argc, const char* const* argv);
};

namespace detail {
class RuntimeImpl;
std::shared_ptr<ActorCell> spawn_actor(RuntimeImpl& rt, const ActorTypeInfo& type, const std::string& signature,
                                       Factory factory, Payload ctor_args, const Options& opts);
void kill_actor(RuntimeImpl& rt, const std::shared_ptr<ActorCell>& cell);
}  // namespace detail

class Elastic;
template <class T>
class ElasticGroup;

// A set of resource bundles reserved together on the cluster (Ray's placement groups): PACK,
// SPREAD, STRICT_PACK or STRICT_SPREAD. All bundles or none (PG-1). Cheap to copy.
class PlacementGroup {
 public:
  // The head's id; 0 for a group the head refused (see ready_future).
  std::uint64_t id() const { return id_; }
  // Completes once every bundle is reserved, as the head pushes it (nothing here polls). Fails
  // with PlacementCode::NotFound if the group is removed first, or with the refusal of a group
  // never created: ErrorCode::BadArguments (a malformed bundle or strategy), ErrorCode::Unavailable
  // (no head, or a wrong token).
  Future<void> ready_future() const;
  // ready_future() done, and not failed, within `timeout`; false otherwise (a group still waiting
  // for room stays pending and is placed once room appears).
  bool ready(std::chrono::milliseconds timeout) const;
  // "PENDING", "CREATED", "RESCHEDULING" (a node died; its bundles wait for room), "REMOVED", or
  // "REFUSED" (never created).
  std::string state() const;
  // Releases every bundle and kills the actors placed in them. Idempotent.
  void remove() const;

 private:
  friend class Runtime;
  PlacementGroup(detail::RuntimeImpl* rt, std::uint64_t id, std::shared_ptr<const Error> refused = nullptr)
      : rt_(rt), id_(id), refused_(std::move(refused)) {}
  detail::RuntimeImpl* rt_ = nullptr;
  std::uint64_t id_ = 0;
  std::shared_ptr<const Error> refused_;
};

class Runtime {
 public:
  // Starts a runtime. With RuntimeConfig::address it joins that cluster now: the head's refusal
  // (a wrong or missing token) or its absence is the error value (ErrorCode::Unavailable).
  // Without one, the embedded head and node start when first needed. Only one runtime may be
  // live per process at a time (throws std::logic_error).
  static Result<Runtime> create(RuntimeConfig config = {});

  Runtime(Runtime&&) noexcept;
  Runtime& operator=(Runtime&&) noexcept;
  ~Runtime();   // shutdown()

  // Starts an actor of a TROUPE_ACTOR-registered type; its constructor runs on the actor's own
  // thread with `args` (msgpack-encoded, so the same spawn works for a worker process). Returns
  // at once; calls made before the constructor finishes queue behind it. If the constructor
  // throws, every call fails with ActorDied naming the exception. If the head refuses a worker
  // actor (bad resources, no head, a wrong token), ready() and every call fail with the refusal
  // (BadArguments or Unavailable) and id() is 0: nothing throws here but an argument that does
  // not encode (CallError, BadArguments).
  template <class T, class... A>
  ActorRef<T> spawn(const Options& opts, A&&... args);
  template <class T>
  ActorRef<T> spawn() { return spawn<T>(Options{}); }

  // n actors of one type, each constructed with the same arguments.
  template <class T, class... A>
  ActorGroup<T> spawn_group(std::size_t n, const Options& opts, const A&... args);

  // An elastic group (troupe/elastic.hpp): between `e`'s min and max members of T, as the cluster
  // has room, placed and replaced by the head; waits until min members run (bounded by the
  // group's wait, then throws CallError(Unavailable) with the head's reason).
  template <class T, class... A>
  ElasticGroup<T> spawn_elastic_group(const Elastic& e, const Options& opts, A&&... args);

  // Stops the actor: its pending and queued calls fail with ActorDied at once; a call it is
  // running finishes first, and its result is dropped. Idempotent.
  template <class T>
  void kill(const ActorRef<T>& ref) { if (ref.valid()) detail::kill_actor(*impl_, ref.cell()); }

  // Reserves `bundles` ("CPU=1,GPU=1" each) with `strategy` on the cluster (joining it, or
  // starting the embedded one). Returns at once; see PlacementGroup::ready_future, which also
  // carries a refusal (a malformed bundle or strategy, no head, a wrong token): nothing throws.
  // The group is removed when this driver ends, however it ends (JOB-1), unless `lifetime_detached`.
  PlacementGroup placement_group(const std::vector<std::string>& bundles, const std::string& strategy = "PACK",
                                 const std::string& name = "", bool lifetime_detached = false);

  // Joins the cluster now (without RuntimeConfig::address: starts the embedded head and node):
  // its failure comes back as an error value (ErrorCode::Unavailable) instead of at the first
  // spawn. Idempotent once it succeeded; create() has done it for a runtime with an address.
  Status connect();

  // Stops every actor (their calls fail with ActorDied), then joins all threads. Idempotent.
  void shutdown();
  const RuntimeConfig& config() const;

 private:
  explicit Runtime(std::unique_ptr<detail::RuntimeImpl> impl);
  template <class T>
  friend class ElasticGroup;
  std::unique_ptr<detail::RuntimeImpl> impl_;
};

// Builds a Runtime from argv and the environment, first setting malloc for tensor work (freed memory
// kept, a 64 MiB top pad: runtime/src/process_memory.hpp). On a bad flag or variable, or with --address
// when the head cannot be reached or refuses (a wrong token), it prints the reason to stderr and exits
// with status 2. In a worker process (--troupe-worker) it runs the worker loop and never returns.
Runtime init(int argc, char** argv);

template <class T, class... A>
ActorRef<T> Runtime::spawn(const Options& opts, A&&... args) {
  static_assert(detail::ActorTraits<T>::registered, "register the type with TROUPE_ACTOR(Type, methods...)");
  static_assert(std::is_constructible_v<T, detail::wire_t<A>&&...>, "no constructor takes these arguments");
  using Ctor = detail::CtorFactory<T, detail::wire_t<A>...>;
  (void)Ctor::registered;
  Payload p;
  try {
    detail::RemoteArgs crossing(opts.needs_process());
    p = encode_args(detail::as_param<detail::wire_t<A>>(std::forward<A>(args))...);
  } catch (const ErrorException& e) {
    throw CallError(Error{e.error().code, "constructor arguments: " + e.error().message});
  } catch (const std::exception& e) {
    throw CallError(Error{ErrorCode::BadArguments, std::string("constructor arguments: ") + e.what()});
  }
  const auto* type = detail::Registry::instance().find(detail::ActorTraits<T>::name());
  return ActorRef<T>(detail::spawn_actor(*impl_, *type, Ctor::signature(), &Ctor::make, std::move(p), opts));
}

template <class T, class... A>
ActorGroup<T> Runtime::spawn_group(std::size_t n, const Options& opts, const A&... args) {
  std::vector<ActorRef<T>> members;
  members.reserve(n);
  for (std::size_t i = 0; i < n; ++i) members.push_back(spawn<T>(opts, args...));
  return ActorGroup<T>(std::move(members));
}

}  // namespace troupe
