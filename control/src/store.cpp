#include "troupe/control/store.hpp"

#include <sqlite3.h>

#include <mutex>

#include <nlohmann/json.hpp>

namespace troupe::control {
namespace {

constexpr const char* kSchemaVersion = "4";   // 3: actors and groups have an owner; 4: jobs

const char* const kSchema = R"sql(
CREATE TABLE IF NOT EXISTS nodes (
  id INTEGER PRIMARY KEY, address TEXT, hostname TEXT, state TEXT, resources TEXT, pid INTEGER,
  registered_ms INTEGER, last_seen_ms INTEGER);
CREATE TABLE IF NOT EXISTS actors (
  id INTEGER PRIMARY KEY, type TEXT, name TEXT, ctor_signature TEXT, ctor_args BLOB, binary TEXT,
  resources TEXT, max_restarts INTEGER, max_retries INTEGER, placement_group INTEGER, bundle_index INTEGER,
  colocate INTEGER, colocate_with INTEGER, state TEXT, node INTEGER, worker INTEGER, bundle INTEGER,
  reserved INTEGER, pid INTEGER, gateway TEXT, incarnation INTEGER, restarts INTEGER, reason TEXT, owner INTEGER,
  job INTEGER);
CREATE TABLE IF NOT EXISTS placement_groups (
  id INTEGER PRIMARY KEY, name TEXT, strategy TEXT, bundles TEXT, wait INTEGER, bundle_nodes TEXT, owner INTEGER);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS jobs (
  id INTEGER PRIMARY KEY, spec TEXT, state TEXT, message TEXT, exit_code INTEGER, signal INTEGER, node INTEGER,
  driver_pid INTEGER, attempts INTEGER, submitted_ms INTEGER, started_ms INTEGER, ended_ms INTEGER, owner INTEGER,
  stop_requested INTEGER);
)sql";

Error bad_row(const char* table, std::int64_t id, const std::string& why) {
  return Error{ControlCode::Store, std::string("store: row ") + std::to_string(id) + " of " + table + ": " + why};
}

template <class T>
T must(Result<T> r, const char* table, std::int64_t id) {
  if (!r.ok()) throw ErrorException(bad_row(table, id, r.error().message));
  return std::move(*r);
}

// Bundles and their nodes as JSON arrays of text and numbers.
std::string bundles_text(const std::vector<placement::Resources>& bundles) {
  nlohmann::json j = nlohmann::json::array();
  for (const auto& b : bundles) j.push_back(b.to_string());
  return j.dump();
}

class Statement {
 public:
  Statement(sqlite3* db, const char* sql) : db_(db) {
    if (sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr) != SQLITE_OK) {
      throw ErrorException(Error{ControlCode::Store, std::string("prepare: ") + sqlite3_errmsg(db)});
    }
  }
  ~Statement() { sqlite3_finalize(stmt_); }
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;

  Statement& bind(int i, const std::string& v) {
    sqlite3_bind_text(stmt_, i, v.data(), int(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  Statement& bind_blob(int i, const char* data, std::size_t size) {
    sqlite3_bind_blob(stmt_, i, data, int(size), SQLITE_TRANSIENT);
    return *this;
  }
  Statement& bind(int i, std::int64_t v) {
    sqlite3_bind_int64(stmt_, i, v);
    return *this;
  }
  // Steps once: true while a row is available.
  bool step(const char* what) {
    int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    throw ErrorException(Error{ControlCode::Store, std::string(what) + ": " + sqlite3_errmsg(db_)});
  }
  std::string text(int col) const {
    auto* p = reinterpret_cast<const char*>(sqlite3_column_blob(stmt_, col));
    return p ? std::string(p, std::size_t(sqlite3_column_bytes(stmt_, col))) : std::string();
  }
  std::int64_t integer(int col) const { return sqlite3_column_int64(stmt_, col); }
  bool is_null(int col) const { return sqlite3_column_type(stmt_, col) == SQLITE_NULL; }

 private:
  sqlite3* db_;
  sqlite3_stmt* stmt_ = nullptr;
};

class SqliteStore final : public Store {
 public:
  explicit SqliteStore(const std::string& path) {
    if (sqlite3_open(path.c_str(), &db_) != SQLITE_OK) {
      std::string msg = db_ ? sqlite3_errmsg(db_) : "out of memory";
      sqlite3_close(db_);
      throw ErrorException(Error{ControlCode::Store, "cannot open store " + path + ": " + msg});
    }
    sqlite3_busy_timeout(db_, 5000);
    try {
      exec("PRAGMA journal_mode=WAL;");
      exec("PRAGMA synchronous=NORMAL;");
      check_schema(path);
    } catch (...) {
      sqlite3_close(db_);
      throw;
    }
  }
  ~SqliteStore() override { sqlite3_close(db_); }

  void put_node(const NodeRecord& n) override {
    std::lock_guard lk(mu_);
    Statement s(db_, "INSERT OR REPLACE INTO nodes VALUES (?,?,?,?,?,?,?,?)");
    s.bind(1, std::int64_t(n.id)).bind(2, n.address).bind(3, n.hostname).bind(4, std::string(to_string(n.state)))
        .bind(5, n.total.to_string()).bind(6, n.pid).bind(7, n.registered_ms).bind(8, n.last_seen_ms);
    s.step("put_node");
  }

  std::vector<NodeRecord> nodes() override {
    std::lock_guard lk(mu_);
    Statement s(db_, "SELECT id,address,hostname,state,resources,pid,registered_ms,last_seen_ms FROM nodes ORDER BY id");
    std::vector<NodeRecord> out;
    while (s.step("nodes")) {
      NodeRecord n;
      const std::int64_t id = s.integer(0);
      n.id = std::uint64_t(id);
      n.address = s.text(1);
      n.hostname = s.text(2);
      n.state = must(parse_node_state(s.text(3)), "nodes", id);
      n.total = must(placement::Resources::parse(s.text(4)), "nodes", id);
      n.pid = s.integer(5);
      n.registered_ms = s.integer(6);
      n.last_seen_ms = s.integer(7);
      out.push_back(std::move(n));
    }
    return out;
  }

  void put_actor(const ActorRecord& a) override {
    std::lock_guard lk(mu_);
    Statement s(db_, "INSERT OR REPLACE INTO actors VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)");
    const SpawnSpec& p = a.spec;
    s.bind(1, std::int64_t(a.id)).bind(2, p.type).bind(3, p.name).bind(4, p.ctor_signature)
        .bind_blob(5, p.ctor_args.data(), p.ctor_args.size()).bind(6, p.binary).bind(7, p.resources.to_string())
        .bind(8, p.max_restarts).bind(9, p.max_retries).bind(10, std::int64_t(p.placement_group))
        .bind(11, std::int64_t(p.bundle_index)).bind(12, std::int64_t(p.colocate))
        .bind(13, std::int64_t(p.colocate_with)).bind(14, std::string(to_string(a.state)))
        .bind(15, std::int64_t(a.node)).bind(16, std::int64_t(a.worker)).bind(17, std::int64_t(a.bundle))
        .bind(18, std::int64_t(a.reserved)).bind(19, a.pid).bind(20, a.gateway).bind(21, std::int64_t(a.incarnation))
        .bind(22, a.restarts).bind(23, a.reason).bind(24, std::int64_t(p.owner)).bind(25, std::int64_t(p.job));
    s.step("put_actor");
  }

  std::vector<ActorRecord> actors() override {
    std::lock_guard lk(mu_);
    Statement s(db_, "SELECT id,type,name,ctor_signature,ctor_args,binary,resources,max_restarts,max_retries,"
                     "placement_group,bundle_index,colocate,colocate_with,state,node,worker,bundle,reserved,pid,gateway,"
                     "incarnation,restarts,reason,owner,job FROM actors ORDER BY id");
    std::vector<ActorRecord> out;
    while (s.step("actors")) {
      ActorRecord a;
      const std::int64_t id = s.integer(0);
      a.id = std::uint64_t(id);
      SpawnSpec& p = a.spec;
      p.type = s.text(1);
      p.name = s.text(2);
      p.ctor_signature = s.text(3);
      const std::string args = s.text(4);
      p.ctor_args.assign(args.begin(), args.end());
      p.binary = s.text(5);
      p.resources = must(placement::Resources::parse(s.text(6)), "actors", id);
      p.max_restarts = s.integer(7);
      p.max_retries = s.integer(8);
      p.placement_group = std::uint64_t(s.integer(9));
      p.bundle_index = int(s.integer(10));
      p.colocate = s.integer(11) != 0;
      p.colocate_with = std::uint64_t(s.integer(12));
      a.state = must(parse_actor_state(s.text(13)), "actors", id);
      a.node = std::uint64_t(s.integer(14));
      a.worker = std::uint64_t(s.integer(15));
      a.bundle = int(s.integer(16));
      a.reserved = s.integer(17) != 0;
      a.pid = s.integer(18);
      a.gateway = s.text(19);
      a.incarnation = std::uint64_t(s.integer(20));
      a.restarts = s.integer(21);
      a.reason = s.text(22);
      p.owner = std::uint64_t(s.integer(23));
      p.job = std::uint64_t(s.integer(24));
      out.push_back(std::move(a));
    }
    return out;
  }

  void put_group(const GroupRecord& g) override {
    std::lock_guard lk(mu_);
    Statement s(db_, "INSERT OR REPLACE INTO placement_groups VALUES (?,?,?,?,?,?,?)");
    s.bind(1, std::int64_t(g.id)).bind(2, g.name).bind(3, std::string(placement::to_string(g.strategy)))
        .bind(4, bundles_text(g.bundles)).bind(5, std::int64_t(g.wait_if_unplaced))
        .bind(6, nlohmann::json(g.bundle_nodes).dump()).bind(7, std::int64_t(g.owner));
    s.step("put_group");
  }

  void remove_group(std::uint64_t id) override {
    std::lock_guard lk(mu_);
    Statement s(db_, "DELETE FROM placement_groups WHERE id=?");
    s.bind(1, std::int64_t(id));
    s.step("remove_group");
  }

  std::vector<GroupRecord> groups() override {
    std::lock_guard lk(mu_);
    Statement s(db_, "SELECT id,name,strategy,bundles,wait,bundle_nodes,owner FROM placement_groups ORDER BY id");
    std::vector<GroupRecord> out;
    while (s.step("placement_groups")) {
      GroupRecord g;
      const std::int64_t id = s.integer(0);
      g.id = std::uint64_t(id);
      g.name = s.text(1);
      g.strategy = must(placement::parse_strategy(s.text(2)), "placement_groups", id);
      g.wait_if_unplaced = s.integer(4) != 0;
      g.owner = std::uint64_t(s.integer(6));
      try {
        for (const auto& b : nlohmann::json::parse(s.text(3))) {
          g.bundles.push_back(must(placement::Resources::parse(b.get<std::string>()), "placement_groups", id));
        }
        g.bundle_nodes = nlohmann::json::parse(s.text(5)).get<std::vector<std::uint64_t>>();
      } catch (const nlohmann::json::exception& e) {
        throw ErrorException(bad_row("placement_groups", id, std::string("bad bundles: ") + e.what()));
      }
      if (g.bundle_nodes.size() != g.bundles.size()) {
        throw ErrorException(bad_row("placement_groups", id, "bundle nodes do not match its bundles"));
      }
      out.push_back(std::move(g));
    }
    return out;
  }

  void put_job(const JobRecord& j) override {
    std::lock_guard lk(mu_);
    Statement s(db_, "INSERT OR REPLACE INTO jobs VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)");
    s.bind(1, std::int64_t(j.id)).bind(2, j.spec.to_json().dump()).bind(3, std::string(to_string(j.state)))
        .bind(4, j.message);
    if (j.exit_code) s.bind(5, std::int64_t(*j.exit_code));
    if (j.signal) s.bind(6, std::int64_t(*j.signal));
    s.bind(7, std::int64_t(j.node)).bind(8, j.driver_pid).bind(9, j.attempts).bind(10, j.submitted_ms)
        .bind(11, j.started_ms).bind(12, j.ended_ms).bind(13, std::int64_t(j.owner))
        .bind(14, std::int64_t(j.stop_requested));
    s.step("put_job");
  }

  void remove_job(std::uint64_t id) override {
    std::lock_guard lk(mu_);
    Statement s(db_, "DELETE FROM jobs WHERE id=?");
    s.bind(1, std::int64_t(id));
    s.step("remove_job");
  }

  std::vector<JobRecord> jobs() override {
    std::lock_guard lk(mu_);
    Statement s(db_, "SELECT id,spec,state,message,exit_code,signal,node,driver_pid,attempts,submitted_ms,started_ms,"
                     "ended_ms,owner,stop_requested FROM jobs ORDER BY id");
    std::vector<JobRecord> out;
    while (s.step("jobs")) {
      JobRecord j;
      const std::int64_t id = s.integer(0);
      j.id = std::uint64_t(id);
      const auto spec = nlohmann::json::parse(s.text(1), nullptr, false);
      j.spec = must(JobSpec::from_json(spec), "jobs", id);
      j.state = must(parse_job_state(s.text(2)), "jobs", id);
      j.message = s.text(3);
      if (!s.is_null(4)) j.exit_code = int(s.integer(4));
      if (!s.is_null(5)) j.signal = int(s.integer(5));
      j.node = std::uint64_t(s.integer(6));
      j.driver_pid = s.integer(7);
      j.attempts = s.integer(8);
      j.submitted_ms = s.integer(9);
      j.started_ms = s.integer(10);
      j.ended_ms = s.integer(11);
      j.owner = std::uint64_t(s.integer(12));
      j.stop_requested = s.integer(13) != 0;
      out.push_back(std::move(j));
    }
    return out;
  }

  void put_meta(const std::string& key, const std::string& value) override {
    std::lock_guard lk(mu_);
    Statement s(db_, "INSERT OR REPLACE INTO meta VALUES (?,?)");
    s.bind(1, key).bind(2, value);
    s.step("put_meta");
  }

  std::optional<std::string> get_meta(const std::string& key) override {
    std::lock_guard lk(mu_);
    Statement s(db_, "SELECT value FROM meta WHERE key=?");
    s.bind(1, key);
    if (!s.step("get_meta")) return std::nullopt;
    return s.text(0);
  }

 private:
  // A new database gets this version's tables; one with tables must have been written by it.
  void check_schema(const std::string& path) {
    bool empty = false;
    {
      Statement s(db_, "SELECT count(*) FROM sqlite_master WHERE type='table'");
      empty = s.step("schema") && s.integer(0) == 0;
    }
    if (empty) {   // in one transaction, as the migration below: a failure leaves the file as it was
      in_transaction([&] {
        exec(kSchema);
        exec((std::string("INSERT INTO meta VALUES ('schema','") + kSchemaVersion + "');").c_str());
      });
      return;
    }
    std::string found;
    try {
      Statement s(db_, "SELECT value FROM meta WHERE key='schema'");
      if (s.step("schema")) found = s.text(0);
    } catch (const ErrorException&) {   // no meta table: not a store of this version
    }
    if (found == "3") {   // the version before jobs: the new table and column, nothing else changes
      in_transaction([&] {   // all of it or none (a full disk half way left a store no head could open)
        exec("ALTER TABLE actors ADD COLUMN job INTEGER;");
        exec(kSchema);
        exec((std::string("UPDATE meta SET value='") + kSchemaVersion + "' WHERE key='schema';").c_str());
      });
      return;
    }
    if (found != kSchemaVersion) {
      throw ErrorException(Error{ControlCode::Store, "store " + path + " has schema '" + found + "', this troupe reads " +
                                                         kSchemaVersion + ": start the head in a new session directory"});
    }
    exec(kSchema);   // tables added since (none yet) appear; existing ones are untouched
  }

  template <class F>
  void in_transaction(F&& body) {
    exec("BEGIN IMMEDIATE;");
    try {
      body();
      exec("COMMIT;");
    } catch (...) {
      sqlite3_exec(db_, "ROLLBACK;", nullptr, nullptr, nullptr);
      throw;
    }
  }

  void exec(const char* sql) {
    char* err = nullptr;
    if (sqlite3_exec(db_, sql, nullptr, nullptr, &err) != SQLITE_OK) {
      std::string msg = err ? err : "unknown error";
      sqlite3_free(err);
      throw ErrorException(Error{ControlCode::Store, std::string("store: ") + msg});
    }
  }

  std::mutex mu_;
  sqlite3* db_ = nullptr;
};

}  // namespace

std::unique_ptr<Store> open_sqlite_store(const std::string& path) { return std::make_unique<SqliteStore>(path); }

}  // namespace troupe::control
