// The head's durable tables: nodes, actors, placement groups and jobs, as typed
// records. Writes go through this one small interface so another backend (etcd, Redis) can replace
// SQLite. Every method is thread-safe. Errors throw ErrorException(ControlCode::Store) naming the
// operation; a row that does not read back as a record (a state or resource text this version does
// not know) is such an error too, naming the table and the row, and changes nothing stored.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "troupe/control/records.hpp"
#include "troupe/error.hpp"

namespace troupe::control {

class Store {
 public:
  virtual ~Store() = default;
  virtual void put_node(const NodeRecord& n) = 0;
  virtual std::vector<NodeRecord> nodes() = 0;          // by id
  virtual void put_actor(const ActorRecord& a) = 0;
  virtual std::vector<ActorRecord> actors() = 0;        // by id
  virtual void put_group(const GroupRecord& g) = 0;
  virtual void remove_group(std::uint64_t id) = 0;
  virtual std::vector<GroupRecord> groups() = 0;        // by id
  virtual void put_job(const JobRecord& j) = 0;
  virtual void remove_job(std::uint64_t id) = 0;
  virtual std::vector<JobRecord> jobs() = 0;            // by id
  virtual void put_meta(const std::string& key, const std::string& value) = 0;
  virtual std::optional<std::string> get_meta(const std::string& key) = 0;
};

// Opens (creating if needed) an SQLite database in WAL mode at `path`. A database this version
// did not write (its `schema` meta is missing or another number) is refused, not altered; one of
// the version before (3: no jobs) gains the jobs table and the actors' job column.
std::unique_ptr<Store> open_sqlite_store(const std::string& path);

}  // namespace troupe::control
