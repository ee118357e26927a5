// Jobs end to end: `troupe job ...` against a head and node daemons on 127.0.0.1 (real processes),
// with tests/integration/job_program.cpp as the entrypoint (and a shell, for what a shell does).
#include <doctest/doctest.h>

#include <archive.h>
#include <archive_entry.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "cluster_harness.hpp"
#include "support/temp_dir.hpp"
#include "troupe/net/address.hpp"
#include "troupe/net/digest.hpp"
#include "troupe/net/http.hpp"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

json job_json(const itest::Cluster& c, const std::string& id) {
  auto r = c.job({"status", id, "--json"});
  const auto brace = r.output.find('{');
  if (r.status != 0 || brace == std::string::npos) return json::object();
  return json::parse(r.output.substr(brace), nullptr, false);
}

template <class Pred>
bool wait_job(const itest::Cluster& c, const std::string& id, Pred pred, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred(job_json(c, id))) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return pred(job_json(c, id));
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The entries of directory `dir` whose name starts with `prefix`.
std::vector<fs::path> entries(const fs::path& dir, const std::string& prefix) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->path().filename().string().rfind(prefix, 0) == 0) out.push_back(it->path());
  }
  return out;
}

// The id `submit --no-wait` printed: its last stdout line (stderr says what happened).
std::string submitted_id(const itest::CommandResult& r) {
  std::string out = r.output;
  while (!out.empty() && out.back() == '\n') out.pop_back();
  const auto nl = out.rfind('\n');
  return nl == std::string::npos ? out : out.substr(nl + 1);
}

// A working directory with the job program and a data file.
std::string make_working_dir(const std::string& root, const std::string& data) {
  const fs::path dir = fs::path(root) / "wd";
  fs::create_directories(dir);
  fs::copy_file(TROUPE_JOB_PROGRAM, dir / "job_program", fs::copy_options::overwrite_existing);
  std::ofstream(dir / "data.txt") << data;
  return dir.string();
}

troupe::net::HttpResponse head_http(const itest::Cluster& c, const std::string& method, const std::string& target,
                            const std::string& body, const std::string& token) {
  auto [host, port] = troupe::net::split_address(c.address());
  return troupe::net::http_call(host, port, method, target, body, token, std::chrono::seconds(10));
}

std::size_t live_actors_of(const json& status, std::uint64_t node) {
  std::size_t n = 0;
  for (const auto& a : status.value("actors", json::array())) {
    if (a.value("state", "") != "dead" && (node == 0 || a.value("node", std::uint64_t{0}) == node)) ++n;
  }
  return n;
}

// A tar archive whose one entry is `name` (a file), or a symlink `name` -> `link` when link is set.
void write_archive(const std::string& path, const std::string& name, const std::string& link = "") {
  archive* a = archive_write_new();
  archive_write_set_format_pax_restricted(a);
  archive_write_open_filename(a, path.c_str());
  archive_entry* e = archive_entry_new();
  archive_entry_set_pathname(e, name.c_str());
  const std::string content = "evil\n";
  if (link.empty()) {
    archive_entry_set_filetype(e, AE_IFREG);
    archive_entry_set_size(e, la_int64_t(content.size()));
  } else {
    archive_entry_set_filetype(e, AE_IFLNK);
    archive_entry_set_symlink(e, link.c_str());
  }
  archive_entry_set_perm(e, 0644);
  archive_write_header(a, e);
  if (link.empty()) archive_write_data(a, content.data(), content.size());
  archive_entry_free(e);
  archive_write_close(a);
  archive_write_free(a);
}

}  // namespace

TEST_CASE("a job with a working dir runs its driver and its actors from each node's copy, its logs followed to SUCCEEDED") {
  test_support::TempDir tmp("troupe-jobs");
  itest::Cluster c("CPU=2,headnode=1");
  const std::string cache2 = tmp.path + "/node2-cache";
  // Node 2 keeps 8 bytes of each job process's output in its own copy; the head's log is whole.
  c.add_node("CPU=2,side=2", {"--cache-dir", cache2, "--work-dir", tmp.path + "/node2", "--local-log-bytes", "8"});
  const std::string wd = make_working_dir(tmp.path, "hello from the package");

  // The driver needs what only the head's node has; its actors what only node 2 has.
  auto r = c.job({"submit", "--working-dir", wd, "--entrypoint-resources", "CPU=1,headnode=1", "--name", "echoes", "--",
                  "./job_program", "actors", "CPU=1,side=1"},
                 std::chrono::seconds(90));
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK(r.output.find("data.txt: hello from the package") != std::string::npos);   // read from its own directory
  CHECK(r.output.find("reply: hi 0 from pid") != std::string::npos);
  // The workers' own output, prefixed with their actors' labels (log_to_driver).
  CHECK(r.output.find("(echo0#") != std::string::npos);
  CHECK(r.output.find("echo says hi 1") != std::string::npos);
  // Node 2 fetched the package into its own cache and ran the worker from its own copy.
  const std::string exe_line = "worker exe: " + tmp.path + "/node2/jobs/";
  CHECK(r.output.find(exe_line) != std::string::npos);
  bool cached = false;
  for (const auto& e : fs::directory_iterator(cache2)) cached = cached || e.path().extension() == ".tar";
  CHECK(cached);

  auto list = c.job({"list", "--json"});
  REQUIRE(list.status == 0);
  auto jobs = json::parse(list.output.substr(list.output.find('[')));
  REQUIRE(jobs.size() == 1);
  const std::string id = std::to_string(jobs[0]["id"].get<std::uint64_t>());
  const json j = job_json(c, id);
  CHECK(j["state"] == "SUCCEEDED");
  CHECK(j["exit_code"] == 0);
  CHECK(j["signal"].is_null());
  CHECK(j["attempts"] == 1);
  CHECK(j["name"] == "echoes");
  CHECK(j["node"] == 1);
  CHECK(j["driver_pid"].is_number());
  CHECK(j["entrypoint"] == json::array({"./job_program", "actors", "CPU=1,side=1"}));
  for (const char* key : {"message", "submitted_at", "started_at", "ended_at"}) CHECK_MESSAGE(j.contains(key), key);
  CHECK(j["started_at"].is_number());
  CHECK(j["ended_at"].get<std::int64_t>() >= j["started_at"].get<std::int64_t>());
  // Its logs are the head's: the whole run again, workers' lines included.
  auto logs = c.job({"logs", id});
  CHECK(logs.status == 0);
  CHECK(logs.output.find("echo says hi 0") != std::string::npos);
  CHECK(logs.output.find("driver of job " + id + " attempt 1") != std::string::npos);
  // Node 2's copies of its workers' output (the job's only workers) kept 8 bytes each, then a line
  // saying so; node 1's copy of the driver's output is whole.
  const fs::path session = fs::path(c.temp_dir()) / "session_latest";
  const std::string capped = "\n[troupe] this node's copy of the output stops here, at 8 bytes;";
  int capped_logs = 0;
  for (const auto& path : entries(session / "logs", "worker-")) {
    const std::string text = read_file(path.string());
    INFO(path.string() << ": " << text);
    CHECK((text.size() <= 8 || text.find(capped) == 8));
    if (text.find(capped) == 8) ++capped_logs;
    CHECK(text.size() < 8 + capped.size() + 64);
  }
  CHECK(capped_logs >= 1);
  std::vector<fs::path> driver_logs;
  for (const auto& node_dir : entries(session, "node-")) {
    const fs::path log = node_dir / "jobs" / id / "driver-1.log";
    if (fs::exists(log)) driver_logs.push_back(log);
  }
  REQUIRE(driver_logs.size() == 1);
  const std::string driver_copy = read_file(driver_logs[0].string());
  CHECK(driver_copy.find("reply: hi 0 from pid") != std::string::npos);
  CHECK(driver_copy.find("[troupe] this node's copy") == std::string::npos);
  // JOB-1: nothing of the job is left.
  CHECK(c.wait_until([](const json& s) { return live_actors_of(s, 0) == 0; }, std::chrono::seconds(5)));
}

TEST_CASE("a failing entrypoint ends FAILED with its exit code, and a stopped shell job leaves no process behind") {
  itest::Cluster c("CPU=2");
  auto r = c.job({"submit", "--", "sh", "-c", "echo going; exit 7"});
  INFO(r.output);
  CHECK(r.status == 7);   // submit, waiting, exits with the job's own status
  CHECK(r.output.find("going") != std::string::npos);
  const json failed = job_json(c, "1");
  CHECK(failed["state"] == "FAILED");
  CHECK(failed["exit_code"] == 7);
  CHECK(failed["message"].get<std::string>().find("exited with 7") != std::string::npos);

  // A shell whose child ignores nothing: stop takes the process group.
  auto s = c.job({"submit", "--no-wait", "--", "sh", "-c", "sleep 300 & echo child $!; wait"});
  REQUIRE(s.status == 0);
  const std::string id = submitted_id(s);
  pid_t child = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (child == 0 && std::chrono::steady_clock::now() < deadline) {
    auto logs = c.job({"logs", id});
    if (auto at = logs.output.find("child "); at != std::string::npos) child = pid_t(std::stol(logs.output.substr(at + 6)));
    else std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  REQUIRE(child > 0);
  const json before = job_json(c, id);
  CHECK(before["state"] == "PENDING");   // a shell never connects a troupe runtime
  CHECK(before["message"].get<std::string>().find("driver started") != std::string::npos);
  const pid_t shell = pid_t(before["driver_pid"].get<std::int64_t>());
  auto stop = c.job({"stop", id, "--grace-s", "2"});
  INFO(stop.output);
  CHECK(stop.status == 0);
  CHECK(job_json(c, id)["state"] == "STOPPED");
  const auto gone_by = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while ((!itest::process_gone(child) || !itest::process_gone(shell)) && std::chrono::steady_clock::now() < gone_by) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  CHECK(itest::process_gone(child));
  CHECK(itest::process_gone(shell));
  auto again = c.job({"stop", id});
  CHECK(again.status == 0);
  CHECK(again.output.find("already ended") != std::string::npos);
}

TEST_CASE("a job that turns its node's copy of its log into a FIFO or a symlink neither stalls the node nor writes through") {
  test_support::TempDir tmp("troupe-jobs-fifo");
  itest::Cluster c("CPU=2");
  // The node copies the driver's output to driver-1.log in the job's directory, the driver's cwd.
  auto fifo = c.job({"submit", "--", "sh", "-c", "rm -f driver-1.log && mkfifo driver-1.log && echo after the fifo && sleep 0.3 && echo still here"},
                    std::chrono::seconds(30));
  INFO(fifo.output);
  CHECK(fifo.status == 0);
  CHECK(fifo.output.find("still here") != std::string::npos);
  const std::string victim = tmp.path + "/victim";
  auto link = c.job({"submit", "--", "sh", "-c", "rm -f driver-1.log && ln -s " + victim + " driver-1.log && echo through the link"},
                    std::chrono::seconds(30));
  INFO(link.output);
  CHECK(link.status == 0);
  CHECK(link.output.find("through the link") != std::string::npos);
  CHECK_FALSE(fs::exists(victim));   // the node wrote nothing through the link
  auto after = c.job({"submit", "--", "sh", "-c", "echo the node still runs jobs"}, std::chrono::seconds(30));
  CHECK(after.status == 0);
  CHECK(after.output.find("the node still runs jobs") != std::string::npos);
}

TEST_CASE("stop of a running job frees its actors, workers and group within 5 s, and a pending job stops without running") {
  test_support::TempDir tmp("troupe-jobs");
  itest::Cluster c("CPU=4");
  const std::string wd = make_working_dir(tmp.path, "");
  auto s = c.job({"submit", "--no-wait", "--working-dir", wd, "--", "./job_program", "hold", "CPU=1"});
  REQUIRE(s.status == 0);
  const std::string id = submitted_id(s);
  REQUIRE(wait_job(c, id, [](const json& j) { return j.value("state", "") == "RUNNING"; }, std::chrono::seconds(20)));
  REQUIRE(c.wait_until([](const json& st) {
    return live_actors_of(st, 0) == 2 && st.value("placement_groups", json::array()).size() == 1;
  }, std::chrono::seconds(20)));
  std::vector<pid_t> workers;
  const json before = c.status();   // kept: a range over c.status()["actors"] would outlive its temporary
  for (const auto& a : before["actors"]) workers.push_back(pid_t(a.value("pid", 0)));
  const auto t0 = std::chrono::steady_clock::now();
  auto stop = c.job({"stop", id, "--grace-s", "3"});
  INFO(stop.output);
  CHECK(stop.status == 0);
  const bool freed = c.wait_until([](const json& st) {
    const auto& n = st["nodes"][0];
    return live_actors_of(st, 0) == 0 && st.value("placement_groups", json::array()).empty() &&
           n.value("available", "") == n.value("resources", "");
  }, std::chrono::seconds(5));
  CHECK(freed);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
  const json stopped = job_json(c, id);
  CHECK(stopped["state"] == "STOPPED");
  const auto gone_by = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  for (pid_t w : workers) {
    while (w > 0 && !itest::process_gone(w) && std::chrono::steady_clock::now() < gone_by) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    CHECK(itest::process_gone(w));
  }

  // Resources no node has: PENDING with the reason, then STOPPED, never started.
  auto p = c.job({"submit", "--no-wait", "--entrypoint-resources", "CPU=1,nosuch=1", "--", "sh", "-c", "echo ran"});
  REQUIRE(p.status == 0);
  const std::string pending = submitted_id(p);
  const json waiting = job_json(c, pending);
  CHECK(waiting["state"] == "PENDING");
  CHECK(waiting["message"].get<std::string>().find("waiting for a node with") != std::string::npos);
  auto ps = c.job({"stop", pending});
  CHECK(ps.status == 0);
  const json never = job_json(c, pending);
  CHECK(never["state"] == "STOPPED");
  CHECK(never["attempts"] == 0);
  CHECK(never["started_at"].is_null());
  CHECK(c.job({"logs", pending}).output.find("ran") == std::string::npos);
}

TEST_CASE("max-attempts 2: kill -9 of the driver's node starts attempt 2 on another node") {
  itest::Cluster c("CPU=2");
  const pid_t a = c.add_node("CPU=2,pin=1");
  const pid_t b = c.add_node("CPU=2,pin=1");
  auto s = c.job({"submit", "--no-wait", "--max-attempts", "2", "--entrypoint-resources", "CPU=1,pin=1", "--",
                  TROUPE_JOB_PROGRAM, "attempts", "CPU=1"});
  REQUIRE(s.status == 0);
  const std::string id = submitted_id(s);
  REQUIRE(wait_job(c, id, [](const json& j) { return j.value("state", "") == "RUNNING"; }, std::chrono::seconds(20)));
  REQUIRE(wait_job(c, id, [&](const json&) { return c.job({"logs", id}).output.find("attempt 1 holds") != std::string::npos; },
                   std::chrono::seconds(20)));
  const json first = job_json(c, id);
  const auto first_node = first["node"].get<std::uint64_t>();
  // Nodes 2 and 3 are a and b (node 1 is the head's).
  const pid_t victim = first_node == 2 ? a : b;
  REQUIRE((first_node == 2 || first_node == 3));
  ::kill(victim, SIGKILL);
  REQUIRE(wait_job(c, id, [](const json& j) { return j.value("state", "") == "SUCCEEDED"; }, std::chrono::seconds(30)));
  const json done = job_json(c, id);
  CHECK(done["attempts"] == 2);
  CHECK(done["node"].get<std::uint64_t>() != first_node);
  auto logs = c.job({"logs", id});
  CHECK(logs.output.find("attempt 2 ran on node " + std::to_string(done["node"].get<std::uint64_t>())) != std::string::npos);
}

TEST_CASE("job submissions are idempotent by submission id, live jobs are not deleted, and bad requests are refused") {
  itest::Cluster c("CPU=2");
  auto one = c.job({"submit", "--no-wait", "--submission-id", "sub-1", "--", "sh", "-c", "sleep 30"});
  auto two = c.job({"submit", "--no-wait", "--submission-id", "sub-1", "--", "sh", "-c", "sleep 30"});
  REQUIRE(one.status == 0);
  REQUIRE(two.status == 0);
  CHECK(submitted_id(one) == submitted_id(two));
  CHECK(two.output.find("was submitted before") != std::string::npos);
  auto changed = c.job({"submit", "--no-wait", "--submission-id", "sub-1", "--", "sh", "-c", "sleep 31"});
  CHECK(changed.status == 1);
  CHECK(changed.output.find("(409)") != std::string::npos);
  const std::string id = submitted_id(one);
  CHECK(job_json(c, "sub-1")["id"] == std::stoull(id));   // a submission id names the job too

  auto del = c.job({"delete", id});
  CHECK(del.status == 1);
  CHECK(del.output.find("stop it first") != std::string::npos);
  REQUIRE(c.job({"stop", id, "--grace-s", "1"}).status == 0);
  CHECK(c.job({"delete", id}).status == 0);
  auto gone = c.job({"status", id});
  CHECK(gone.status == 1);
  CHECK(gone.output.find("unknown job") != std::string::npos);

  auto wrong = itest::run({TROUPE_CLI, "job", "list", "--address", c.address(), "--token", "wrong"});
  CHECK(wrong.status == 1);
  CHECK(wrong.output.find("wrong cluster token") != std::string::npos);
  auto unreachable = itest::run({TROUPE_CLI, "job", "list", "--address", "127.0.0.1:1", "--token", c.token()});
  CHECK(unreachable.status == 1);
  CHECK(unreachable.output.find("cannot reach") != std::string::npos);
  auto bad_flag = c.job({"submit", "--max-attempts", "0", "--", "true"});
  CHECK(bad_flag.status != 0);
  // Ids are decimal (not 010 read as 8), seconds are numbers (not nan, which passes a range check).
  auto nan_grace = c.job({"stop", id, "--grace-s", "nan"});
  CHECK(nan_grace.status != 0);
  CHECK(nan_grace.output.find("not a finite number") != std::string::npos);
  auto octal = itest::run({TROUPE_CLI, "node", "drain", "010", "--address", c.address(), "--token", c.token()});
  CHECK(octal.status != 0);
  CHECK(octal.output.find("not a decimal number") != std::string::npos);
  auto bogus_bind = itest::run({TROUPE_CLI, "start", "--address", c.address(), "--token", c.token(), "--bind", "bogus"});
  CHECK(bogus_bind.status != 0);   // refused before it joins: its workers would each fail to listen there
  CHECK(bogus_bind.output.find("not an IP address") != std::string::npos);

  // Malformed bodies: 400 with a JSON error; nothing stored changes.
  const auto before = c.job({"list", "--json"}).output;
  for (const std::string& body : {std::string("not json"), std::string(R"({"entrypoint": "sh"})"),
                                  std::string(R"({"entrypoint": []})"), std::string(R"({"entrypoint": ["x"], "max_attempts": "2"})"),
                                  std::string(R"({"entrypoint": ["x"], "env": {"TROUPE_JOB_ID": "9"}})"),
                                  std::string(R"({"entrypoint": ["x"], "entrypoint_resources": "CPU=lots"})"),
                                  std::string(R"({"entrypoint": ["x"], "package": "abc"})"), std::string("[1,2]"),
                                  std::string(R"({"entrypoint": ["x"], "max_attempts": 2.9})"),
                                  std::string(R"({"entrypoint": ["x"], "max_attempts": -1})"),
                                  std::string(R"({"entrypoint": ["x"], "max_attempts": 4294967297})"),
                                  std::string(R"({"entrypoint": ["x"], "submission_id": "3"})"),
                                  std::string(R"({"entrypoint": ["x"], "submission_id": "a/b"})")}) {
    auto res = head_http(c, "POST", "/api/v1/jobs", body, c.token());
    CHECK_MESSAGE(res.status == 400, body);
    CHECK(json::parse(res.body, nullptr, false).contains("error"));
  }
  CHECK(head_http(c, "GET", "/api/v1/jobs/12345", "", c.token()).status == 404);
  CHECK(head_http(c, "POST", "/api/v1/jobs/12345/stop", "", c.token()).status == 404);
  CHECK(head_http(c, "POST", "/api/v1/jobs", R"({"entrypoint": ["x"]})", "wrong").status == 401);
  CHECK(c.job({"list", "--json"}).output == before);
}

TEST_CASE("refused package uploads (over the size limit, a wrong digest, entries leading out) write nothing outside") {
  test_support::TempDir tmp("troupe-jobs");
  itest::Cluster c("CPU=2", {"--max-package-bytes", "1048576"});
  auto [host, port] = troupe::net::split_address(c.address());
  auto upload = [&](const std::string& file, const std::string& digest) {
    return troupe::net::http_upload(host, port, "PUT", "/api/v1/packages/" + digest, file, c.token(), std::chrono::seconds(30));
  };
  const std::string big = tmp.path + "/big.bin";
  {
    std::ofstream out(big, std::ios::binary);
    std::mt19937 rng(1);
    for (int i = 0; i < (2 << 20) / 4; ++i) {
      const auto v = rng();
      out.write(reinterpret_cast<const char*>(&v), 4);
    }
  }
  auto over = upload(big, troupe::net::sha256_file(big));
  CHECK(over.status == 413);
  CHECK(over.body.find("limit") != std::string::npos);

  const std::string small = tmp.path + "/small.tar";
  write_archive(small, "ok.txt");
  auto mismatch = upload(small, std::string(64, 'a'));
  CHECK(mismatch.status == 400);
  CHECK(mismatch.body.find("digest mismatch") != std::string::npos);
  CHECK(upload(small, troupe::net::sha256_file(small)).status == 200);
  CHECK(head_http(c, "PUT", "/api/v1/packages/not-a-digest", "x", c.token()).status == 400);
  CHECK(head_http(c, "PUT", "/api/v1/packages/" + std::string(64, 'b'), "x", "wrong").status == 401);

  const std::string escape = fs::path(tmp.path).filename().string() + "-escaped.txt";
  struct Case {
    std::string entry, link, why;
  };
  for (const Case& k : {Case{"../" + escape, "", "'..'"}, Case{"/tmp/" + escape, "", "absolute"},
                        Case{"link", "../../" + escape, "symlink"}, Case{"a/../../" + escape, "", "'..'"}}) {
    const std::string file = tmp.path + "/evil.tar";
    write_archive(file, k.entry, k.link);
    auto res = upload(file, troupe::net::sha256_file(file));
    CHECK_MESSAGE(res.status == 400, k.entry);
    CHECK_MESSAGE(res.body.find(k.why) != std::string::npos, res.body);
    CHECK(head_http(c, "GET", "/api/v1/packages/" + troupe::net::sha256_file(file) + "?stat=1", "", c.token()).status == 404);
  }
  CHECK(!fs::exists("/tmp/" + escape));
  CHECK(!fs::exists(fs::path(tmp.path).parent_path() / escape));
  CHECK(c.status().value("nodes", json::array()).size() == 1);   // the head keeps serving
}
