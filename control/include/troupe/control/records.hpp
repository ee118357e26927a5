// The head's records: what its managers hold and its store keeps, with numeric ids and enum
// states, and the commands it gives node daemons and workers. The JSON of the head's HTTP API is
// made from these at the edge (head.cpp); nothing inside the head parses JSON twice.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "troupe/error.hpp"
#include "troupe/placement/placement_group.hpp"
#include "troupe/placement/resources.hpp"

namespace troupe::control {

enum class NodeState : std::uint8_t { Alive, Dead };
// An alive node being emptied on purpose (troupe node drain, or SIGTERM to its daemon): it takes
// nothing new; Drained once nothing is left on it (or its deadline passed), to be stopped.
enum class NodeDrain : std::uint8_t { None, Draining, Drained };
enum class WorkerState : std::uint8_t { Starting, Alive, Dead };
// Pending: placed or waiting for room, not yet running. Restarting: its process died and it is
// being started again (same id, next incarnation: FT-2). Dead is final.
enum class ActorState : std::uint8_t { Pending, Alive, Restarting, Dead };
// A job: Pending (always with its reason) until its driver's runtime connects, Running until the
// driver exits; then Succeeded, Failed (exit code or signal, and a message) or Stopped, final.
enum class JobState : std::uint8_t { Pending, Running, Succeeded, Failed, Stopped };
inline bool ended(JobState s) { return s != JobState::Pending && s != JobState::Running; }

// "alive", "dead", ... as the API and the store spell them.
std::string_view to_string(NodeState s);
std::string_view to_string(WorkerState s);
std::string_view to_string(ActorState s);
std::string_view to_string(JobState s);       // "PENDING", "RUNNING", ... (as Ray's jobs spell them)
// ControlCode::BadRequest for any other text.
Result<NodeState> parse_node_state(std::string_view text);
Result<ActorState> parse_actor_state(std::string_view text);
Result<JobState> parse_job_state(std::string_view text);

// What an actor is and how to run it: the spawn request, checked once where it enters the head.
struct SpawnSpec {
  std::string type;                     // the registered actor type
  std::string name;
  std::string ctor_signature;           // which of the type's constructors
  std::vector<char> ctor_args;          // its msgpack arguments, kept to run it again on restart
  std::string binary;                   // the program whose worker processes can host the type
  placement::Resources resources;
  std::int64_t max_restarts = 0;        // -1: unlimited
  std::int64_t max_retries = 0;         // the caller's, kept for `status`
  std::uint64_t placement_group = 0;    // 0: none
  int bundle_index = -1;                // -1: any bundle of the group with room
  bool colocate = false;                // share the bundle's worker process
  std::uint64_t colocate_with = 0;      // 0: none; else run in that actor's worker process
  std::uint64_t owner = 0;              // the driver link that created it: it goes when that link
                                        // ends (JOB-1); 0: detached, removed only by hand
  std::uint64_t job = 0;                // the job whose process created it, 0: none; a relative
                                        // `binary` names a file of that job's package
  std::uint64_t elastic_group = 0;      // the elastic group it is a member of, 0: none

  // From a create-actor request body ({"type", "ctor_signature", "ctor_args" (hex), "binary",
  // optional "name", "resources", "max_restarts", "max_retries", "placement_group",
  // "bundle_index", "colocate", "colocate_with", "owner"}). ControlCode::BadRequest naming the field.
  static Result<SpawnSpec> from_json(const nlohmann::json& body);
};

struct NodeRecord {
  std::uint64_t id = 0;
  std::string address;                  // the host its workers are reachable on
  std::string hostname;
  NodeState state = NodeState::Alive;
  placement::Resources total;
  std::int64_t pid = 0;                 // its daemon's
  std::int64_t registered_ms = 0;       // wall clock
  std::int64_t last_seen_ms = 0;
  NodeDrain drain = NodeDrain::None;    // not stored: a drain is an operator's, in one head's life
  std::vector<std::string> drain_left;  // Drained: the actors that could not move, as "label: why"
};

struct ActorRecord {
  std::uint64_t id = 0;
  SpawnSpec spec;
  ActorState state = ActorState::Pending;
  std::uint64_t node = 0;               // 0 while it has no place
  std::uint64_t worker = 0;             // 0 while it has no worker process
  int bundle = -1;                      // the bundle it was placed in (resolved index), -1: none
  bool reserved = false;                // the scheduler holds its resources (not so for colocate_with)
  std::int64_t pid = 0;
  std::string gateway;                  // its worker's link address, once running
  std::uint64_t incarnation = 0;        // bumped at each start (FT-2)
  std::int64_t restarts = 0;
  std::string reason;                   // why it is dead, pending or restarting
  bool leaving = false;                 // an elastic member on a draining node: no new calls
};

struct GroupRecord {
  std::uint64_t id = 0;
  std::string name;
  placement::Strategy strategy = placement::Strategy::kPack;
  std::vector<placement::Resources> bundles;
  bool wait_if_unplaced = true;
  std::vector<std::uint64_t> bundle_nodes;   // per bundle: where it is reserved, 0: not reserved
  std::uint64_t owner = 0;                   // as SpawnSpec::owner
};

// An elastic group: members of one spawn spec, as many as the cluster has room for up to its
// target (min <= target <= max); the head starts members as room appears and replaces those that
// die; the driver admits them into its epochs (troupe/elastic.hpp). It goes with its owner.
struct ElasticGroupRecord {
  std::uint64_t id = 0;
  std::string name;
  std::int64_t min = 1, max = 1, target = 1;
  SpawnSpec member;                     // each member's spec (its owner and job are the group's)
  std::uint64_t owner = 0;
  std::uint64_t job = 0;
  std::vector<std::uint64_t> members;   // actors started for it and not dead, oldest first
};

// What a job runs: the submit request, checked once where it enters the head.
struct JobSpec {
  std::vector<std::string> entrypoint;            // argv; [0] a file of the package, a path or a PATH name
  std::string name;
  std::string submission_id;                      // "": none; else the same id is the same job
  std::string package;                            // SHA-256 of its working directory's archive; "": none
  std::map<std::string, std::string> env;
  placement::Resources resources;                 // its driver's (default CPU=1)
  std::int64_t max_attempts = 1;                  // attempts in all, the first included
  std::map<std::string, std::string> metadata;

  // From a submit body ({"entrypoint": [argv], optional "name", "submission_id", "package", "env",
  // "entrypoint_resources", "max_attempts", "metadata"}). ControlCode::BadRequest naming the field.
  static Result<JobSpec> from_json(const nlohmann::json& body);
  nlohmann::json to_json() const;                 // the same fields; from_json reads it back
};

struct JobRecord {
  std::uint64_t id = 0;
  JobSpec spec;
  JobState state = JobState::Pending;
  std::string message;                  // why it is pending, how it ended
  std::optional<int> exit_code;         // its last driver's, when it exited
  std::optional<int> signal;            // the signal that ended its last driver
  std::uint64_t node = 0;               // its current (or last) attempt's node, 0: none yet
  std::int64_t driver_pid = 0;
  std::int64_t attempts = 0;            // attempts started
  std::int64_t submitted_ms = 0, started_ms = 0, ended_ms = 0;   // wall clock; 0: not yet
  std::uint64_t owner = 0;              // its current attempt's owner id: what the attempt creates
  bool stop_requested = false;
  bool placed = false;                  // the scheduler holds its driver's resources
  bool launched = false;                // its current attempt was ordered to start on `node`
  std::string last_failure;             // why its previous attempt failed (in memory only)
};

// body[key] as T: `fallback` when absent or null (the field is required when there is none);
// ControlCode::BadRequest naming the field when it is missing or of the wrong type. Every
// request body and control message the head reads goes through this.
template <class T>
Result<T> read_field(const nlohmann::json& body, const char* key, std::optional<T> fallback = std::nullopt) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) {
    if (fallback) return *std::move(fallback);
    return Error{ControlCode::BadRequest, std::string("missing field '") + key + "'"};
  }
  // A wrong type is named by its type's name, not its text: that could be megabytes, or nest deep
  // enough that printing it overflowed the stack.
  const auto wrong = [&] { return Error{ControlCode::BadRequest, std::string("field '") + key + "' has the wrong type: " + it->type_name()}; };
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {   // whole and in range: nlohmann would floor 2.9 and wrap -1
    if (!it->is_number_integer()) return wrong();
    if constexpr (std::is_unsigned_v<T>) {
      if (!it->is_number_unsigned() || it->template get<std::uint64_t>() > std::uint64_t(std::numeric_limits<T>::max()))
        return Error{ControlCode::BadRequest, std::string("field '") + key + "' is out of range: " + it->dump()};
    } else {
      const bool fits = it->is_number_unsigned() ? it->template get<std::uint64_t>() <= std::uint64_t(std::numeric_limits<T>::max())
                                                 : it->template get<std::int64_t>() >= std::int64_t(std::numeric_limits<T>::min()) &&
                                                       it->template get<std::int64_t>() <= std::int64_t(std::numeric_limits<T>::max());
      if (!fits) return Error{ControlCode::BadRequest, std::string("field '") + key + "' is out of range: " + it->dump()};
    }
  }
  try {
    return it->template get<T>();
  } catch (const nlohmann::json::exception&) {
    return wrong();
  }
}

// A node daemon's orders.
struct NodeCommand {
  enum class Kind : std::uint8_t { StartWorker, KillWorker, StartDriver, StopDriver } kind = Kind::StartWorker;
  std::uint64_t worker = 0;
  std::string binary;                   // StartWorker: absolute, or a file of the job's package
  std::uint64_t job = 0;                // StartWorker of a job's actor, StartDriver, StopDriver
  std::int64_t attempt = 0;             // StartDriver, StopDriver
  std::string package;                  // the job's package digest, "": none
  std::vector<std::string> entrypoint;  // StartDriver
  std::map<std::string, std::string> env;   // StartDriver
  std::vector<int> gpus;                // devices for CUDA_VISIBLE_DEVICES (StartWorker, StartDriver)
  std::int64_t grace_ms = 0;            // StopDriver: SIGTERM, then SIGKILL after this
  nlohmann::json to_json() const;
};

// A worker's orders.
struct WorkerCommand {
  // Drain: report the actor Drained once every call queued to it so far has finished.
  enum class Kind : std::uint8_t { Spawn, Kill, Drain, Exit } kind = Kind::Exit;
  std::uint64_t actor = 0;              // Spawn, Kill, Drain
  std::uint64_t incarnation = 0;        // Spawn, Drain
  std::string type, name, ctor_signature;
  std::vector<char> ctor_args;
  static WorkerCommand spawn(const ActorRecord& a);
  static WorkerCommand kill(std::uint64_t actor);
  static WorkerCommand drain(std::uint64_t actor, std::uint64_t incarnation);
  static WorkerCommand exit();
  nlohmann::json to_json() const;
};

}  // namespace troupe::control
