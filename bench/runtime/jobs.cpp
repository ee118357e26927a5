// build/bench/jobs: the job controller's latencies and throughput on a head and two node daemons
// on this machine (real processes, started with the troupe CLI), over the HTTP API, with
// tests/integration/job_program.cpp as the entrypoint. One JSON object on its last line:
//   submit_to_running_s       POST /jobs -> the driver's runtime connected (its package cached;
//                             the head's own stamps: started_at - submitted_at), median of 7
//   submit_to_running_cold_s  packing and uploading a 64 MiB working dir of random bytes not
//                             cached anywhere, then POST -> connected (the node fetches it)
//   stop_to_released_s        a job holding two worker actors and a placement group: POST stop ->
//                             every resource free again (polled), median of 3
//   jobs_per_s                100 such `connect` jobs, 4 in flight, submit -> SUCCEEDED
// Targets (issue 16): <= 0.3 s cached, <= 1 s stop -> released, >= 20 jobs/s.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <thread>

#include <nlohmann/json.hpp>

#include "../../tests/integration/cluster_harness.hpp"
#include "troupe/control/package.hpp"
#include "troupe/net/address.hpp"
#include "troupe/net/digest.hpp"
#include "troupe/net/http.hpp"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

struct Api {
  std::string host, token;
  std::uint16_t port = 0;
  json call(const std::string& method, const std::string& target, const json& body = nullptr) const {
    auto res = troupe::net::http_call(host, port, method, target, body.is_null() ? "" : body.dump(), token,
                                      std::chrono::seconds(30));
    if (res.status != 200) throw std::runtime_error(method + " " + target + ": " + std::to_string(res.status) + " " + res.body);
    return json::parse(res.body);
  }
  // Packs `dir`, uploads it unless the head has it; its digest.
  std::string upload(const std::string& dir) const {
    const std::string tar = dir + ".tar";
    troupe::control::pack_directory(dir, tar);
    const std::string digest = troupe::net::sha256_file(tar);
    auto have = troupe::net::http_call(host, port, "GET", "/api/v1/packages/" + digest + "?stat=1", "", token,
                                       std::chrono::seconds(10));
    if (have.status != 200) {
      auto res = troupe::net::http_upload(host, port, "PUT", "/api/v1/packages/" + digest, tar, token, std::chrono::minutes(5));
      if (res.status != 200) throw std::runtime_error("upload: " + res.body);
    }
    fs::remove(tar);
    return digest;
  }
  std::uint64_t submit(const std::string& package, const std::vector<std::string>& argv) const {
    return call("POST", "/api/v1/jobs", json{{"entrypoint", argv}, {"package", package}})["id"].get<std::uint64_t>();
  }
  json job(std::uint64_t id) const { return call("GET", "/api/v1/jobs/" + std::to_string(id)); }
};

json wait_job(const Api& api, std::uint64_t id, const std::function<bool(const json&)>& done) {
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  for (;;) {
    json j = api.job(id);
    if (done(j)) return j;
    if (Clock::now() > deadline) throw std::runtime_error("job " + std::to_string(id) + " stuck: " + j.dump());
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

bool ended(const json& j) {
  const auto s = j.value("state", "");
  return s == "SUCCEEDED" || s == "FAILED" || s == "STOPPED";
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

bool all_free(const json& status) {
  for (const auto& a : status.value("actors", json::array())) {
    if (a.value("state", "") != "dead") return false;
  }
  if (!status.value("placement_groups", json::array()).empty()) return false;
  for (const auto& n : status.value("nodes", json::array())) {
    if (n.value("available", "") != n.value("resources", "")) return false;
  }
  return true;
}

}  // namespace

int main() {
  char tmpl[] = "/tmp/troupe-bench-jobs-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) return 1;
  const fs::path root = tmpl;
  int rc = 0;
  try {
    itest::Cluster c("CPU=4");
    c.add_node("CPU=4");
    c.add_node("CPU=4");
    try {
    auto [host, port] = troupe::net::split_address(c.address());
    const Api api{host, c.token(), port};

    const fs::path wd = root / "wd";
    fs::create_directories(wd);
    fs::copy_file(TROUPE_JOB_PROGRAM, wd / "job_program");
    const std::string package = api.upload(wd.string());
    // Every node fetches it once (one job per node would do; a few jobs cover all three).
    for (int i = 0; i < 6; ++i) wait_job(api, api.submit(package, {"./job_program", "connect"}), ended);

    std::vector<double> cached;
    for (int i = 0; i < 7; ++i) {
      json j = wait_job(api, api.submit(package, {"./job_program", "connect"}), ended);
      if (j["state"] != "SUCCEEDED") throw std::runtime_error("a connect job failed: " + j.dump());
      cached.push_back(double(j["started_at"].get<std::int64_t>() - j["submitted_at"].get<std::int64_t>()) / 1000.0);
    }

    // Cold: 64 MiB of random bytes beside the program, never seen by the head or any node.
    const fs::path cold = root / "cold";
    fs::create_directories(cold);
    fs::copy_file(TROUPE_JOB_PROGRAM, cold / "job_program");
    {
      std::ofstream out(cold / "weights.bin", std::ios::binary);
      std::mt19937_64 rng(std::random_device{}());
      std::vector<std::uint64_t> block(1 << 16);
      for (int b = 0; b < 128; ++b) {   // 128 x 512 KiB
        for (auto& v : block) v = rng();
        out.write(reinterpret_cast<const char*>(block.data()), std::streamsize(block.size() * 8));
      }
    }
    const std::int64_t cold_t0 = now_ms();
    const std::string cold_package = api.upload(cold.string());
    json cj = wait_job(api, api.submit(cold_package, {"./job_program", "connect"}), ended);
    if (cj["state"] != "SUCCEEDED") throw std::runtime_error("the cold job failed: " + cj.dump());
    const double cold_s = double(cj["started_at"].get<std::int64_t>() - cold_t0) / 1000.0;

    std::vector<double> released;
    for (int i = 0; i < 3; ++i) {
      const auto id = api.submit(package, {"./job_program", "hold", "CPU=1"});
      wait_job(api, id, [](const json& j) { return j.value("state", "") == "RUNNING" || ended(j); });
      const auto ready_by = Clock::now() + std::chrono::seconds(30);
      for (;;) {   // both actors alive and the group reserved
        json s = api.call("GET", "/api/v1/status");
        std::size_t alive = 0;
        for (const auto& a : s["actors"]) alive += a.value("state", "") == "alive" ? 1 : 0;
        if (alive == 2 && s["placement_groups"].size() == 1) break;
        if (Clock::now() > ready_by) throw std::runtime_error("the hold job never held: " + s.dump());
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      const auto t0 = Clock::now();
      api.call("POST", "/api/v1/jobs/" + std::to_string(id) + "/stop", json{{"grace_s", 10}});
      while (!all_free(api.call("GET", "/api/v1/status"))) std::this_thread::sleep_for(std::chrono::milliseconds(2));
      released.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
      wait_job(api, id, ended);
    }

    const int total = 100, in_flight = 4;
    std::vector<std::uint64_t> live;
    int submitted = 0, finished = 0;
    const auto t0 = Clock::now();
    while (finished < total) {
      while (submitted < total && int(live.size()) < in_flight) {
        live.push_back(api.submit(package, {"./job_program", "connect"}));
        ++submitted;
      }
      for (auto it = live.begin(); it != live.end();) {
        json j = api.job(*it);
        if (!ended(j)) {
          ++it;
          continue;
        }
        if (j["state"] != "SUCCEEDED") throw std::runtime_error("a throughput job failed: " + j.dump());
        ++finished;
        it = live.erase(it);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    const double jobs_per_s = total / std::chrono::duration<double>(Clock::now() - t0).count();

    std::cout << json{{"submit_to_running_s", median(cached)},
                      {"submit_to_running_s_min", *std::min_element(cached.begin(), cached.end())},
                      {"submit_to_running_cold_s", cold_s},
                      {"stop_to_released_s", median(released)},
                      {"jobs_per_s", jobs_per_s},
                      {"nodes", 3},
                      {"targets", {{"submit_to_running_s", 0.3}, {"stop_to_released_s", 1.0}, {"jobs_per_s", 20}}}}
                     .dump()
              << std::endl;
    } catch (...) {
      itest::test_failed = true;   // the cluster's logs and stacks are printed as it goes
      throw;
    }
  } catch (const std::exception& e) {
    std::cerr << "jobs bench: " << e.what() << "\n";
    rc = 1;
  }
  std::error_code ec;
  fs::remove_all(root, ec);
  return rc;
}
