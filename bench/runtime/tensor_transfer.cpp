// build/bench/tensor_transfer: tensor bytes pulled between two processes over the data plane
// (UCX RMA get), for 1 MiB, 64 MiB and 1 GiB, beside single-thread memcpy of the same size
// measured in the same run. The bench re-runs itself as the exposing "server" process.
// Prints one JSON object on its last line. Per size:
//   gbps / fetch_gbps      fetch() (pooled receive buffer) of a region the owner made with
//                          DataPlane::allocate and exposed without a copy (the fast path)
//   fetch_into_gbps        fetch_into() a reused buffer, same region
//   first_fetch_gbps       the first fetch of that region (rkey unpack, segment attach, prefault)
//   first_fetch_into_gbps  the first fetch of a new region into a warm buffer
//   copy_expose_gbps       owner's ordinary memory: expose (one copy into a fresh UCP region)
//                          + first fetch, end to end, a new region each time
//   memcpy_gbps            memcpy between two warm buffers of that size
// Best of several repetitions after a warm-up. Options: --reps-scale F (default 1).
#include <nlohmann/json.hpp>

#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "../../tests/support/pipe_io.hpp"
#include "troupe/transport/data_plane.hpp"

namespace tp = troupe::transport;
using troupe::DType;
using troupe::TensorView;
using Clock = std::chrono::steady_clock;
using test_support::read_exact;
using test_support::write_exact;

namespace {

constexpr auto kReplyTimeout = std::chrono::seconds(60);
constexpr auto kFetchTimeout = std::chrono::seconds(30);

struct Request {
  char op;               // 'A' allocate (no copy), 'C' ordinary memory (copied), 'R' release, 'Q' quit
  std::uint64_t value;   // bytes, or region id for 'R'
};

void fill(void* p, std::size_t n) {
  auto* w = static_cast<std::uint64_t*>(p);
  for (std::size_t i = 0; i < n / 8; ++i) w[i] = i * 0x9e3779b97f4a7c15ULL;
}

bool check(const void* p, std::size_t n) {
  auto* w = static_cast<const std::uint64_t*>(p);
  for (std::size_t i = 0; i < n / 8; ++i) if (w[i] != i * 0x9e3779b97f4a7c15ULL) return false;
  return true;
}

// ---- server: exposes what the client asks for --------------------------------------------------

int run_server(int rfd, int wfd) {
  tp::DataPlane plane;
  std::map<tp::RegionId, TensorView> live;
  for (Request rq{}; read_exact(rfd, &rq, sizeof rq, Clock::now() + std::chrono::hours(1)) && rq.op != 'Q';) {
    if (rq.op == 'R') {
      plane.release(rq.value);
      live.erase(rq.value);
      continue;
    }
    auto n = std::int64_t(rq.value);
    TensorView t = rq.op == 'A' ? plane.allocate(DType::U8, {n}) : TensorView::empty(DType::U8, {n});
    fill(t.data, rq.value);
    auto t0 = Clock::now();
    auto d = plane.expose(t);
    double expose_s = std::chrono::duration<double>(Clock::now() - t0).count();
    live[d.region] = t;
    auto bytes = tp::encode(d);
    auto len = std::uint32_t(bytes.size());
    write_exact(wfd, &len, 4);
    write_exact(wfd, bytes.data(), len);
    write_exact(wfd, &expose_s, sizeof expose_s);
  }
  return 0;
}

// ---- client -----------------------------------------------------------------------------------

class Server {
 public:
  explicit Server(const char* self) {
    int up[2], down[2];
    if (::pipe(up) != 0 || ::pipe(down) != 0) throw std::runtime_error("pipe");
    std::string r = std::to_string(down[0]), w = std::to_string(up[1]), flag = "--server";
    std::vector<char*> argv{const_cast<char*>(self), flag.data(), r.data(), w.data(), nullptr};
    pid_ = ::fork();
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      ::close(up[0]);
      ::close(down[1]);
      ::execv("/proc/self/exe", argv.data());
      ::_exit(127);
    }
    ::close(up[1]);
    ::close(down[0]);
    from_ = up[0];
    to_ = down[1];
  }
  ~Server() {
    Request q{'Q', 0};
    try { write_exact(to_, &q, sizeof q); } catch (...) {}
    ::close(to_);
    ::close(from_);
    for (int i = 0; i < 500 && ::waitpid(pid_, nullptr, WNOHANG) == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (::kill(pid_, 0) == 0) { ::kill(pid_, SIGKILL); ::waitpid(pid_, nullptr, 0); }
  }

  tp::TensorDescriptor expose(char op, std::size_t bytes, double* expose_s) {
    Request rq{op, bytes};
    write_exact(to_, &rq, sizeof rq);
    std::uint32_t len = 0;
    const auto deadline = Clock::now() + kReplyTimeout;
    if (!read_exact(from_, &len, 4, deadline)) throw std::runtime_error("server did not answer");
    std::vector<char> b(len);
    if (!read_exact(from_, b.data(), len, deadline) || !read_exact(from_, expose_s, sizeof *expose_s, deadline))
      throw std::runtime_error("server did not answer");
    return tp::decode_descriptor(b);
  }
  void release(tp::RegionId id) { Request rq{'R', id}; write_exact(to_, &rq, sizeof rq); }

 private:
  pid_t pid_ = -1;
  int from_ = -1, to_ = -1;
};

template <class F>
double best_gbps(std::size_t bytes, int reps, F&& once) {
  once();   // warm-up
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    auto t0 = Clock::now();
    once();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return double(bytes) / best / 1e9;
}

nlohmann::json measure(Server& server, tp::DataPlane& plane, std::size_t bytes, int reps) {
  nlohmann::json j;
  j["bytes"] = bytes;
  std::vector<char> a(bytes, 1), b(bytes, 2);
  j["memcpy_gbps"] = best_gbps(bytes, reps, [&] { std::memcpy(b.data(), a.data(), bytes); });
  double expose_s = 0;
  auto d = server.expose('A', bytes, &expose_s);
  auto t0 = Clock::now();
  auto first = plane.fetch(d, kFetchTimeout);
  j["first_fetch_gbps"] = double(bytes) / std::chrono::duration<double>(Clock::now() - t0).count() / 1e9;
  if (!check(first.data, bytes)) throw std::runtime_error("fetched bytes differ");
  j["fetch_gbps"] = best_gbps(bytes, reps, [&] { (void)plane.fetch(d, kFetchTimeout); });
  j["fetch_into_gbps"] = best_gbps(bytes, reps, [&] { plane.fetch_into(d, first, kFetchTimeout); });
  server.release(d.region);
  d = server.expose('A', bytes, &expose_s);   // a new region into a warm buffer: attach cost alone
  t0 = Clock::now();
  plane.fetch_into(d, first, kFetchTimeout);
  j["first_fetch_into_gbps"] = double(bytes) / std::chrono::duration<double>(Clock::now() - t0).count() / 1e9;
  server.release(d.region);
  double best = 1e30;   // ordinary memory: the owner's copy, then the first pull, a new region each time
  for (int i = 0; i < std::max(2, reps / 2); ++i) {
    d = server.expose('C', bytes, &expose_s);
    t0 = Clock::now();
    (void)plane.fetch(d, kFetchTimeout);
    best = std::min(best, expose_s + std::chrono::duration<double>(Clock::now() - t0).count());
    server.release(d.region);
  }
  j["copy_expose_gbps"] = double(bytes) / best / 1e9;
  j["gbps"] = j["fetch_gbps"];
  j["ratio_vs_memcpy"] = j["gbps"].get<double>() / j["memcpy_gbps"].get<double>();
  j["fetch_into_ratio_vs_memcpy"] = j["fetch_into_gbps"].get<double>() / j["memcpy_gbps"].get<double>();
  return j;
}

std::string load_average() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return a + " " + b + " " + c;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::strcmp(argv[1], "--server") == 0) return run_server(std::atoi(argv[2]), std::atoi(argv[3]));
  double scale = 1.0;
  for (int i = 1; i + 1 < argc; ++i) if (std::strcmp(argv[i], "--reps-scale") == 0) scale = std::atof(argv[i + 1]);
  try {
    Server server(argv[0]);   // forked before this process starts UCX
    tp::DataPlane plane;
    nlohmann::json j;
    j["load_before"] = load_average();
    const std::pair<const char*, std::size_t> sizes[] = {{"1MiB", 1u << 20}, {"64MiB", 64u << 20}, {"1GiB", 1u << 30}};
    const int reps[] = {50, 10, 4};
    for (int i = 0; i < 3; ++i) j[sizes[i].first] = measure(server, plane, sizes[i].second, std::max(1, int(reps[i] * scale)));
    j["target_1GiB_ratio"] = 0.5;
    j["meets_target"] = j["1GiB"]["ratio_vs_memcpy"].get<double>() >= 0.5;
    j["load_after"] = load_average();
    const char* tls = std::getenv("UCX_TLS");
    j["ucx_tls"] = tls != nullptr ? tls : "default";
    j["hardware_threads"] = std::thread::hardware_concurrency();
    std::cout << j.dump() << std::endl;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tensor_transfer: %s\n", e.what());
    return 1;
  }
  return 0;
}
