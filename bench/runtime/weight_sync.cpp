// build/bench/weight_sync: time to move one version of fp32 weights to 1, 2 or 4 receivers over
// each CPU path, beside a memcpy of the same size measured in the same run. Prints one JSON
// object {"results": [...]} last.
//   inproc     a subscriber in the publisher's process takes the version (pointer swap)
//   same_host  receivers in other worker processes on this host; "mode": "map" (the default for
//              subscribers: the publisher's version mapped in place, never written, no copy) or
//              "copy" (a private, checksummed copy out of the publisher's shared memory)
//   cross_node two daemons on 127.0.0.1 with UCX_TLS=tcp; "mode": "tree" (receivers follow a
//              binary tree level by level, each relaying a version once it has all of it) or
//              "chain" (chain_broadcast: each relay serves its child bucket by bucket as it lands)
// Memory on small machines: 2 GiB copies run with 1 receiver only ("note" in their entries).
//   --sizes-mib 64,512,2048   --reps N (timed repetitions after one warm-up, best kept)
//   --only inproc,map,copy,tree,chain   the rows to run (all by default; for profiling one path)
//   --device D   instead of the CPU paths, the GPU path on CUDA device D (bench/device/weight_sync.sh):
//                "same_gpu", a publisher mirroring each version on D and receivers in other worker
//                processes taking it by CUDA IPC, "mode" "in_place" or "copy" (device to device);
//                "memcpy_gbps" is then cudaMemcpy device-to-device on D. A last, untimed round
//                checks every receiver's bytes on the device against the publisher's checksum.
//                With 2+ GPUs also "nccl_group": the publisher's store on D as rank 0 of an NCCL
//                group, receivers on the other GPUs taking each version by the group's broadcast
//                (the first, untimed round forms the group).
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../../tests/integration/cluster_harness.hpp"
#include "troupe/troupe.hpp"
#include "troupe/weights.hpp"
#include "gpu_sync.hpp"

using troupe::ActorRef;
using troupe::WeightStore;
using Clock = std::chrono::steady_clock;

namespace {

constexpr std::size_t kMiB = std::size_t(1) << 20;
constexpr int kTensors = 8;
int g_reps = 2;

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double memcpy_gbps(std::size_t bytes) {
  std::vector<char> a(bytes, 1), b(bytes, 0);   // touched: no page faults in the timing
  double best = 1e9;
  for (int i = 0; i < 3; ++i) {
    auto t0 = Clock::now();
    std::memcpy(b.data(), a.data(), bytes);
    best = std::min(best, since(t0));
  }
  return double(bytes) / best / 1e9;
}

nlohmann::json entry(const char* path, std::size_t bytes, int receivers, double seconds, double mc,
                     const char* mode = nullptr) {
  nlohmann::json e{{"path", path}, {"bytes", bytes}, {"receivers", receivers}, {"seconds", seconds},
                   {"gbps", double(bytes) / seconds / 1e9}, {"memcpy_gbps", mc}};
  if (mode != nullptr) e["mode"] = mode;
  return e;
}

std::vector<std::int64_t> numels(std::size_t bytes) {
  return std::vector<std::int64_t>(kTensors, std::int64_t(bytes / 4 / kTensors));
}

// In-process: publish a new version each round, time the subscribers' update (pointer swap).
double inproc(troupe::Runtime& rt, std::size_t bytes, int receivers) {
  auto store = rt.spawn<WeightStore>(troupe::Options{});
  std::vector<std::unique_ptr<troupe::WeightSubscriber>> subs;
  for (int i = 0; i < receivers; ++i) subs.push_back(std::make_unique<troupe::WeightSubscriber>(store));
  double best = 1e9;
  for (int rep = 0; rep <= g_reps; ++rep) {
    store.call(&WeightStore::publish_synthetic, std::uint64_t(rep + 1), numels(bytes), std::uint64_t(rep)).get();
    auto t0 = Clock::now();
    for (auto& s : subs) (void)s->update();
    if (rep > 0) best = std::min(best, since(t0));
  }
  rt.kill(store);
  return best;
}

// How receivers get a version: all from the publisher, down a binary tree level by level (each
// relay serves a version once it has all of it), or down a pipelined chain (chain_broadcast).
enum class Fanout { kDirect, kTree, kChain };

// Receivers follow the publisher to a version published just before the clock starts. Returns
// every round's seconds: the warm-up first (connections and endpoints made), then g_reps timed
// rounds. `map`: receivers map the publisher's version in place when they can (same host).
std::vector<double> broadcast(troupe::Runtime& rt, const troupe::Options& pub_opts, const troupe::Options& recv_opts,
                              std::size_t bytes, int receivers, Fanout fanout, bool map = false) {
  auto pub = rt.spawn<WeightStore>(pub_opts);
  std::vector<ActorRef<WeightStore>> relays;
  troupe::PublisherOptions relay;
  relay.relay_maps = map;
  for (int i = 0; i < receivers; ++i) relays.push_back(rt.spawn<WeightStore>(recv_opts, relay));
  auto follow_all = [&](std::uint64_t version) {
    if (fanout == Fanout::kChain) return troupe::chain_broadcast(pub, relays, version, std::chrono::seconds(300));
    const bool tree = fanout == Fanout::kTree;
    std::size_t level_start = 0, level_size = 2;
    while (level_start < relays.size()) {
      std::vector<troupe::Future<std::uint64_t>> fs;
      std::size_t end = tree ? std::min(relays.size(), level_start + level_size) : relays.size();
      for (std::size_t k = level_start; k < end; ++k) {
        auto src = tree ? troupe::tree_sources(pub, relays, k) : std::vector<ActorRef<WeightStore>>{pub};
        fs.push_back(relays[k].call(&WeightStore::follow, src, version));
      }
      for (auto& f : fs) (void)f.get();
      level_start = end;
      level_size *= 2;
    }
  };
  std::vector<double> rounds;
  for (int rep = 0; rep <= g_reps; ++rep) {   // a new version each round, as after each optimizer step
    const auto version = std::uint64_t(rep + 1);
    for (auto& r : relays) r.call(&WeightStore::clear).get();
    pub.call(&WeightStore::publish_synthetic, version, numels(bytes), version).get();
    auto t0 = Clock::now();
    follow_all(version);
    rounds.push_back(since(t0));
  }
  for (auto& r : relays) rt.kill(r);
  rt.kill(pub);
  return rounds;
}

// The entry of a broadcast: the best timed round, and every round's time under "rounds".
nlohmann::json rounds_entry(const char* path, std::size_t bytes, int receivers, const std::vector<double>& rounds,
                            double mc, const char* mode = nullptr) {
  double best = *std::min_element(rounds.begin() + 1, rounds.end());
  auto e = entry(path, bytes, receivers, best, mc, mode);
  e["rounds"] = rounds;
  return e;
}

std::vector<int> receiver_counts(std::size_t bytes, bool copies = true) {
  if (copies && bytes > 512 * kMiB) return {1};   // 2 GiB x (publisher + 4 copies) does not fit a small machine
  return {1, 2, 4};
}

// A GPU receiver in its own process: pulls versions into device memory (`group` named: as a
// member of that NCCL group of `size` GPUs).
struct GpuReceiver {
  std::unique_ptr<troupe::WeightSubscriber> sub;
  void setup(ActorRef<WeightStore> source, std::int32_t device, bool in_place, bool verify, std::string group,
             std::int32_t size) {
    troupe::SubscriberOptions opts;
    opts.device = device;
    opts.map_shared = in_place;
    opts.verify_mapped = verify;
    opts.nccl_group = std::move(group);
    opts.nccl_group_size = size;
    sub = std::make_unique<troupe::WeightSubscriber>(std::move(source), opts);
  }
  std::int32_t pull(std::uint64_t version) { return sub->update(version)->device(); }
  void clear() { sub->reset(); }
};

}  // namespace

TROUPE_ACTOR(GpuReceiver, setup, pull, clear);

namespace {

// A GPU path: the publisher's store mirrors each version on `device`, receiver i pulls it into
// GPU gpus[i] — by CUDA IPC from `device` itself (in place or copied), or, with `group` named,
// by the store's broadcast to that NCCL group (the first, untimed round forms it). Every round a
// new version, published before the clock starts; the receivers pull it together. Then one
// checked round (verify on every receiver; a group is formed anew for it). Throws when a group's
// round did not go by its broadcast (another path would be timed under its name).
std::vector<double> gpu_rounds(troupe::Runtime& rt, std::size_t bytes, int device, const std::vector<std::int32_t>& gpus,
                               bool in_place, const std::string& group) {
  auto procs = troupe::Options{}.process(true);
  troupe::PublisherOptions mirrored;
  mirrored.device = device;
  auto pub = rt.spawn<WeightStore>(procs, mirrored);
  std::vector<ActorRef<GpuReceiver>> recvs;
  for (std::size_t i = 0; i < gpus.size(); ++i) recvs.push_back(rt.spawn<GpuReceiver>(procs));
  auto setup = [&](bool verify) {
    for (std::size_t i = 0; i < recvs.size(); ++i) {
      recvs[i].call(&GpuReceiver::setup, pub, gpus[i], in_place, verify, group, std::int32_t(gpus.size() + 1)).get();
    }
  };
  auto broadcasts = [&] { return pub.call(&WeightStore::stats).get().group_broadcasts; };
  std::uint64_t version = 0;
  auto round = [&] {
    for (auto& r : recvs) r.call(&GpuReceiver::clear).get();
    pub.call(&WeightStore::publish_synthetic, ++version, numels(bytes), version).get();
    const auto sent = broadcasts();
    auto t0 = Clock::now();
    std::vector<troupe::Future<std::int32_t>> fs;
    for (auto& r : recvs) fs.push_back(r.call(&GpuReceiver::pull, version));
    for (std::size_t i = 0; i < fs.size(); ++i) {
      if (fs[i].get() != gpus[i]) throw std::runtime_error("weight_sync: a receiver's set is not on its GPU");
    }
    double s = since(t0);
    if (!group.empty()) {   // the store counts a broadcast once its side is done, maybe just after the receivers'
      for (int i = 0; i < 100 && broadcasts() != sent + 1; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      if (broadcasts() != sent + 1) {
        throw std::runtime_error("nccl_group: the version did not go by the group's broadcast (see the log)");
      }
    }
    return s;
  };
  std::vector<double> rounds;
  setup(false);
  for (int rep = 0; rep <= g_reps; ++rep) rounds.push_back(round());
  setup(true);
  (void)round();   // throws (the bench fails) on a checksum mismatch
  for (auto& r : recvs) rt.kill(r);
  rt.kill(pub);
  return rounds;
}

int gpu_main(troupe::Runtime& rt, int device, const std::vector<std::size_t>& sizes) {
  std::string why;
  nlohmann::json results = nlohmann::json::array();
  for (auto bytes : sizes) {
    double d2d = troupe::detail::weights::gpu::copy_gbps(bytes, device, &why);
    if (d2d <= 0) {
      std::cerr << "weight_sync: no usable CUDA device " << device << ": " << why << "\n";
      return 2;
    }
    for (bool in_place : {true, false}) {
      for (int n : {1, 2, 4}) {
        const std::vector<std::int32_t> same(std::size_t(n), device);
        auto e = rounds_entry("same_gpu", bytes, n, gpu_rounds(rt, bytes, device, same, in_place, ""), d2d,
                              in_place ? "in_place" : "copy");
        e["reference"] = "cudaMemcpy device to device";
        results.push_back(e);
        std::cerr << results.back().dump() << "\n";
      }
    }
    const int others = troupe::detail::weights::gpu::device_count(&why) - 1;
    for (int n : {1, 2, 4}) {
      if (n > others) {
        std::cerr << "weight_sync: nccl_group with " << n << " receivers needs " << n + 1 << " GPUs; skipped\n";
        continue;
      }
      std::vector<std::int32_t> others_gpus;   // every GPU but the publisher's, first n
      for (std::int32_t g = 0; int(others_gpus.size()) < n; ++g) {
        if (g != device) others_gpus.push_back(g);
      }
      const std::string group = "bench-" + std::to_string(bytes) + "-" + std::to_string(n);
      auto e = rounds_entry("nccl_group", bytes, n, gpu_rounds(rt, bytes, device, others_gpus, false, group), d2d,
                            "broadcast");
      e["reference"] = "cudaMemcpy device to device on the publisher's GPU";
      results.push_back(e);
      std::cerr << results.back().dump() << "\n";
    }
  }
  std::cout << nlohmann::json{{"results", results}}.dump() << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Worker processes of this benchmark run this binary too: init() never returns in them.
  std::optional<troupe::Runtime> rt_slot(troupe::init(argc, argv));
  troupe::Runtime& rt = *rt_slot;
  std::vector<std::size_t> sizes = {64 * kMiB, 512 * kMiB, 2048 * kMiB};
  int device = -1;
  std::string only = "inproc,map,copy,tree,chain";
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--only") == 0) only = argv[i + 1];
    if (std::strcmp(argv[i], "--reps") == 0) g_reps = std::max(1, std::atoi(argv[i + 1]));
    if (std::strcmp(argv[i], "--sizes-mib") == 0) {
      sizes.clear();
      std::stringstream ss(argv[i + 1]);
      for (std::string s; std::getline(ss, s, ',');) sizes.push_back(std::size_t(std::stoll(s)) * kMiB);
    }
    if (std::strcmp(argv[i], "--device") == 0) device = std::atoi(argv[i + 1]);
  }
  if (device >= 0) return gpu_main(rt, device, sizes);
  auto runs = [&](const std::string& row) { return ("," + only + ",").find("," + row + ",") != std::string::npos; };
  nlohmann::json results = nlohmann::json::array();
  std::vector<double> mc;
  for (auto bytes : sizes) {
    mc.push_back(memcpy_gbps(bytes));
    for (int n : runs("inproc") ? receiver_counts(bytes) : std::vector<int>{}) {
      results.push_back(entry("inproc", bytes, n, inproc(rt, bytes, n), mc.back()));
    }
    auto opts = troupe::Options{}.process(true);
    for (int n : runs("map") ? receiver_counts(bytes, false) : std::vector<int>{}) {
      results.push_back(rounds_entry("same_host", bytes, n, broadcast(rt, opts, opts, bytes, n, Fanout::kDirect, true), mc.back(), "map"));
      std::cerr << results.back().dump() << "\n";
    }
    for (int n : runs("copy") ? receiver_counts(bytes) : std::vector<int>{}) {
      results.push_back(rounds_entry("same_host", bytes, n, broadcast(rt, opts, opts, bytes, n, Fanout::kDirect, false), mc.back(), "copy"));
      std::cerr << results.back().dump() << "\n";
    }
  }
  rt_slot.reset();   // one runtime per process at a time
  if (runs("tree") || runs("chain")) {
    ::setenv("UCX_TLS", "tcp,self", 1);   // the daemons' workers inherit it: UCX over TCP loopback
    itest::Cluster cluster("CPU=2");
    cluster.add_node("CPU=2,node_a=1");
    cluster.add_node("CPU=8,node_b=8");
    troupe::RuntimeConfig cfg;
    cfg.address = cluster.address();
    cfg.token = cluster.token();
    cfg.remote_call_timeout = std::chrono::seconds(300);
    auto crt = troupe::Runtime::create(cfg).value();
    auto pub_opts = troupe::Options{}.resources("node_a=1");
    auto recv_opts = troupe::Options{}.resources("node_b=1");
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      for (int n : receiver_counts(sizes[i])) {
        for (auto [fanout, mode] : {std::pair{Fanout::kTree, "tree"}, std::pair{Fanout::kChain, "chain"}}) {
          if (!runs(mode)) continue;
          results.push_back(rounds_entry("cross_node", sizes[i], n, broadcast(crt, pub_opts, recv_opts, sizes[i], n, fanout), mc[i], mode));
          std::cerr << results.back().dump() << "\n";
        }
      }
    }
  }
  for (auto& r : results) {
    if (r["bytes"].get<std::size_t>() > 512 * kMiB && r.value("mode", "copy") == "copy") {
      r["note"] = "2 GiB copies run with 1 receiver only (memory)";
    }
  }
  std::cout << nlohmann::json{{"results", results}}.dump() << std::endl;
  return 0;
}
