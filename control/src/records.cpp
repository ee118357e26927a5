#include "troupe/control/records.hpp"

#include <array>
#include <optional>
#include <utility>

#include "troupe/net/digest.hpp"
#include "troupe/net/hex.hpp"

namespace troupe::control {
namespace {

using json = nlohmann::json;

constexpr std::array<std::string_view, 2> kNodeStates = {"alive", "dead"};
constexpr std::array<std::string_view, 3> kWorkerStates = {"starting", "alive", "dead"};
constexpr std::array<std::string_view, 4> kActorStates = {"pending", "alive", "restarting", "dead"};
constexpr std::array<std::string_view, 5> kJobStates = {"PENDING", "RUNNING", "SUCCEEDED", "FAILED", "STOPPED"};

template <class E, std::size_t N>
Result<E> parse_state(std::string_view text, const std::array<std::string_view, N>& names, const char* what) {
  for (std::size_t i = 0; i < N; ++i) {
    if (names[i] == text) return static_cast<E>(i);
  }
  return Error{ControlCode::BadRequest, "unknown " + std::string(what) + " state '" + std::string(text) + "'"};
}

// Reads a request body's fields; the first missing or mistyped one is kept as a BadRequest.
class Fields {
 public:
  explicit Fields(const json& body) : body_(body) {}

  template <class T>
  T get(const char* key, std::optional<T> fallback = std::nullopt) {
    auto r = read_field<T>(body_, key, std::move(fallback));
    if (r.ok()) return std::move(r).value();
    if (!error_) error_ = r.error();
    return T{};
  }
  const std::optional<Error>& error() const { return error_; }

 private:
  const json& body_;
  std::optional<Error> error_;
};

}  // namespace

std::string_view to_string(NodeState s) { return kNodeStates[std::size_t(s)]; }
std::string_view to_string(WorkerState s) { return kWorkerStates[std::size_t(s)]; }
std::string_view to_string(ActorState s) { return kActorStates[std::size_t(s)]; }
std::string_view to_string(JobState s) { return kJobStates[std::size_t(s)]; }
Result<JobState> parse_job_state(std::string_view text) { return parse_state<JobState>(text, kJobStates, "job"); }
Result<NodeState> parse_node_state(std::string_view text) { return parse_state<NodeState>(text, kNodeStates, "node"); }
Result<ActorState> parse_actor_state(std::string_view text) {
  return parse_state<ActorState>(text, kActorStates, "actor");
}

Result<SpawnSpec> SpawnSpec::from_json(const json& body) {
  if (!body.is_object()) return Error{ControlCode::BadRequest, "a spawn request is a JSON object"};
  Fields f(body);
  SpawnSpec s;
  s.type = f.get<std::string>("type");
  s.name = f.get<std::string>("name", "");
  s.ctor_signature = f.get<std::string>("ctor_signature");
  const auto args = f.get<std::string>("ctor_args");
  s.binary = f.get<std::string>("binary");
  const auto resources = f.get<std::string>("resources", "");
  s.max_restarts = f.get<std::int64_t>("max_restarts", 0);
  s.max_retries = f.get<std::int64_t>("max_retries", 0);
  s.placement_group = f.get<std::uint64_t>("placement_group", 0);
  s.bundle_index = f.get<int>("bundle_index", -1);
  s.colocate = f.get<bool>("colocate", false);
  s.colocate_with = f.get<std::uint64_t>("colocate_with", 0);
  s.owner = f.get<std::uint64_t>("owner", 0);
  s.job = f.get<std::uint64_t>("job", 0);
  if (f.error()) return *f.error();
  if (s.type.empty()) return Error{ControlCode::BadRequest, "type must not be empty"};
  if (s.binary.empty()) return Error{ControlCode::BadRequest, "binary must not be empty"};
  if (s.binary.front() != '/' && s.job == 0) {
    return Error{ControlCode::BadRequest, "binary '" + s.binary + "' is relative: only a job's actor names a file of its package"};
  }
  if (s.max_restarts < -1) return Error{ControlCode::BadRequest, "max_restarts must be -1 (unlimited) or more"};
  if (s.max_retries < 0) return Error{ControlCode::BadRequest, "max_retries must be 0 or more"};
  if (s.bundle_index < -1) return Error{ControlCode::BadRequest, "bundle_index must be -1 (any) or more"};
  try {
    s.ctor_args = net::from_hex(args);
  } catch (const std::invalid_argument& e) {
    return Error{ControlCode::BadRequest, std::string("ctor_args is not hex: ") + e.what()};
  }
  auto parsed = placement::Resources::parse(resources);
  if (!parsed.ok()) return Error{ControlCode::BadRequest, "bad resources '" + resources + "': " + parsed.error().message};
  s.resources = *parsed;
  return s;
}

Result<JobSpec> JobSpec::from_json(const json& body) {
  if (!body.is_object()) return Error{ControlCode::BadRequest, "a job is a JSON object"};
  Fields f(body);
  JobSpec s;
  s.entrypoint = f.get<std::vector<std::string>>("entrypoint");
  s.name = f.get<std::string>("name", "");
  s.submission_id = f.get<std::string>("submission_id", "");
  s.package = f.get<std::string>("package", "");
  s.env = f.get<std::map<std::string, std::string>>("env", std::map<std::string, std::string>{});
  const auto resources = f.get<std::string>("entrypoint_resources", "CPU=1");
  s.max_attempts = f.get<std::int64_t>("max_attempts", 1);
  s.metadata = f.get<std::map<std::string, std::string>>("metadata", std::map<std::string, std::string>{});
  if (f.error()) return *f.error();
  if (s.entrypoint.empty() || s.entrypoint[0].empty()) {
    return Error{ControlCode::BadRequest, "entrypoint must be a non-empty argv array"};
  }
  if (s.max_attempts < 1 || s.max_attempts > 1000) return Error{ControlCode::BadRequest, "max_attempts must be 1 to 1000"};
  if (!s.package.empty() && !net::is_sha256_hex(s.package)) {
    return Error{ControlCode::BadRequest, "package must be a SHA-256 digest in hex"};
  }
  for (const auto& [k, v] : s.env) {
    if (k.empty() || k.find('=') != std::string::npos) return Error{ControlCode::BadRequest, "bad environment variable name '" + k + "'"};
    if (k.rfind("TROUPE_", 0) == 0) return Error{ControlCode::BadRequest, "env may not set " + k + ": troupe sets it"};
  }
  if (s.submission_id.size() > 256) return Error{ControlCode::BadRequest, "submission_id is over 256 characters"};
  auto parsed = placement::Resources::parse(resources);
  if (!parsed.ok()) return Error{ControlCode::BadRequest, "bad entrypoint_resources '" + resources + "': " + parsed.error().message};
  s.resources = *parsed;
  return s;
}

json JobSpec::to_json() const {
  return json{{"entrypoint", entrypoint}, {"name", name}, {"submission_id", submission_id}, {"package", package},
              {"env", env}, {"entrypoint_resources", resources.to_string()}, {"max_attempts", max_attempts},
              {"metadata", metadata}};
}

json NodeCommand::to_json() const {
  switch (kind) {
    case Kind::StartWorker:
      return json{{"kind", "start_worker"}, {"worker_id", worker}, {"binary", binary}, {"job", job},
                  {"package", package}, {"gpus", gpus}};
    case Kind::KillWorker: return json{{"kind", "kill_worker"}, {"worker_id", worker}};
    case Kind::StartDriver:
      return json{{"kind", "start_driver"}, {"job", job}, {"attempt", attempt}, {"package", package},
                  {"entrypoint", entrypoint}, {"env", env}, {"gpus", gpus}};
    case Kind::StopDriver: break;
  }
  return json{{"kind", "stop_driver"}, {"job", job}, {"attempt", attempt}, {"grace_ms", grace_ms}};
}

WorkerCommand WorkerCommand::spawn(const ActorRecord& a) {
  WorkerCommand c;
  c.kind = Kind::Spawn;
  c.actor = a.id;
  c.incarnation = a.incarnation;
  c.type = a.spec.type;
  c.name = a.spec.name;
  c.ctor_signature = a.spec.ctor_signature;
  c.ctor_args = a.spec.ctor_args;
  return c;
}

WorkerCommand WorkerCommand::kill(std::uint64_t actor) {
  WorkerCommand c;
  c.kind = Kind::Kill;
  c.actor = actor;
  return c;
}

WorkerCommand WorkerCommand::drain(std::uint64_t actor, std::uint64_t incarnation) {
  WorkerCommand c;
  c.kind = Kind::Drain;
  c.actor = actor;
  c.incarnation = incarnation;
  return c;
}

WorkerCommand WorkerCommand::exit() { return WorkerCommand{}; }

json WorkerCommand::to_json() const {
  switch (kind) {
    case Kind::Spawn:
      return json{{"kind", "spawn"}, {"actor_id", actor}, {"incarnation", incarnation}, {"type", type},
                  {"name", name}, {"ctor_signature", ctor_signature}, {"ctor_args", net::to_hex(ctor_args)}};
    case Kind::Kill: return json{{"kind", "kill"}, {"actor_id", actor}};
    case Kind::Drain: return json{{"kind", "drain"}, {"actor_id", actor}, {"incarnation", incarnation}};
    case Kind::Exit: break;
  }
  return json{{"kind", "exit"}};
}

}  // namespace troupe::control
