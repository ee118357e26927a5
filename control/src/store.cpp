#include "troupe/control/store.hpp"

#include <sqlite3.h>

#include <mutex>

namespace troupe::control {
namespace {

const char* const kSchema = R"sql(
CREATE TABLE IF NOT EXISTS nodes (
  id TEXT PRIMARY KEY, address TEXT, hostname TEXT, state TEXT, resources TEXT, available TEXT,
  pid INTEGER, registered_ms INTEGER, last_seen_ms INTEGER);
CREATE TABLE IF NOT EXISTS actors (
  id INTEGER PRIMARY KEY, type TEXT, name TEXT, state TEXT, node_id TEXT, worker_id TEXT, pid INTEGER,
  gateway TEXT, incarnation INTEGER, restarts INTEGER, max_restarts INTEGER, resources TEXT,
  ctor_signature TEXT, ctor_args BLOB, spec TEXT, death_reason TEXT);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
)sql";

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
  Statement& bind_blob(int i, const std::string& v) {
    sqlite3_bind_blob(stmt_, i, v.data(), int(v.size()), SQLITE_TRANSIENT);
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
    exec("PRAGMA journal_mode=WAL;");
    exec("PRAGMA synchronous=NORMAL;");
    exec(kSchema);
  }
  ~SqliteStore() override { sqlite3_close(db_); }

  void put_node(const NodeRow& n) override {
    std::lock_guard lk(mu_);
    Statement s(db_, "INSERT OR REPLACE INTO nodes VALUES (?,?,?,?,?,?,?,?,?)");
    s.bind(1, n.id).bind(2, n.address).bind(3, n.hostname).bind(4, n.state).bind(5, n.resources)
        .bind(6, n.available).bind(7, n.pid).bind(8, n.registered_ms).bind(9, n.last_seen_ms);
    s.step("put_node");
  }

  std::vector<NodeRow> nodes() override {
    std::lock_guard lk(mu_);
    Statement s(db_, "SELECT id,address,hostname,state,resources,available,pid,registered_ms,last_seen_ms FROM nodes ORDER BY registered_ms");
    std::vector<NodeRow> out;
    while (s.step("nodes")) {
      out.push_back(NodeRow{s.text(0), s.text(1), s.text(2), s.text(3), s.text(4), s.text(5), s.integer(6),
                            s.integer(7), s.integer(8)});
    }
    return out;
  }

  void put_actor(const ActorRow& a) override {
    std::lock_guard lk(mu_);
    Statement s(db_, "INSERT OR REPLACE INTO actors VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)");
    s.bind(1, std::int64_t(a.id)).bind(2, a.type).bind(3, a.name).bind(4, a.state).bind(5, a.node_id)
        .bind(6, a.worker_id).bind(7, a.pid).bind(8, a.gateway).bind(9, std::int64_t(a.incarnation))
        .bind(10, a.restarts).bind(11, a.max_restarts).bind(12, a.resources).bind(13, a.ctor_signature)
        .bind_blob(14, a.ctor_args).bind(15, a.spec).bind(16, a.death_reason);
    s.step("put_actor");
  }

  std::vector<ActorRow> actors() override {
    std::lock_guard lk(mu_);
    Statement s(db_, "SELECT id,type,name,state,node_id,worker_id,pid,gateway,incarnation,restarts,max_restarts,"
                     "resources,ctor_signature,ctor_args,spec,death_reason FROM actors ORDER BY id");
    std::vector<ActorRow> out;
    while (s.step("actors")) {
      ActorRow a;
      a.id = std::uint64_t(s.integer(0));
      a.type = s.text(1); a.name = s.text(2); a.state = s.text(3); a.node_id = s.text(4); a.worker_id = s.text(5);
      a.pid = s.integer(6); a.gateway = s.text(7); a.incarnation = std::uint64_t(s.integer(8));
      a.restarts = s.integer(9); a.max_restarts = s.integer(10); a.resources = s.text(11);
      a.ctor_signature = s.text(12); a.ctor_args = s.text(13); a.spec = s.text(14); a.death_reason = s.text(15);
      out.push_back(std::move(a));
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
