// The head's durable directory: nodes and actors (and later jobs, placement groups) as rows.
// Writes go through this one small interface so another backend (etcd, Redis) can replace
// SQLite. Every method is thread-safe. Errors throw ErrorException(ControlCode::Store) naming the
// operation.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "troupe/error.hpp"

namespace troupe::control {

struct NodeRow {
  std::string id;
  std::string address;      // host the node's workers are reachable on
  std::string hostname;
  std::string state;        // "alive" | "dead"
  std::string resources;    // total, text form "CPU=2,memory=8G"
  std::string available;    // available, same form
  std::int64_t pid = 0;
  std::int64_t registered_ms = 0;
  std::int64_t last_seen_ms = 0;
};

struct ActorRow {
  std::uint64_t id = 0;
  std::string type;
  std::string name;
  std::string state;        // "pending" | "alive" | "restarting" | "dead"
  std::string node_id;
  std::string worker_id;
  std::int64_t pid = 0;
  std::string gateway;      // "host:port" of the worker's CAF gateway
  std::uint64_t incarnation = 0;
  std::int64_t restarts = 0;
  std::int64_t max_restarts = 0;
  std::string resources;    // requested, text form
  std::string ctor_signature;
  std::string ctor_args;    // the msgpack bytes as hex text, kept to re-run the constructor on restart
  std::string spec;         // JSON: the rest of the spawn request (binary, colocation, ...)
  std::string death_reason;
};

class Store {
 public:
  virtual ~Store() = default;
  virtual void put_node(const NodeRow& n) = 0;
  virtual std::vector<NodeRow> nodes() = 0;
  virtual void put_actor(const ActorRow& a) = 0;
  virtual std::vector<ActorRow> actors() = 0;
  virtual void put_meta(const std::string& key, const std::string& value) = 0;
  virtual std::optional<std::string> get_meta(const std::string& key) = 0;
};

// Opens (creating if needed) an SQLite database in WAL mode at `path`.
std::unique_ptr<Store> open_sqlite_store(const std::string& path);

}  // namespace troupe::control
