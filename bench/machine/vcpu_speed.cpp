// vcpu_speed: whether the CPUs of this machine compute equally fast, and stay so. One thread runs
// the same chunk of arithmetic (a few passes of a multiply-add over a buffer that fits a core's
// cache) pinned to each allowed CPU in turn, round and round, and sums each CPU's time per window.
// On a VM a vCPU is a host thread sharing its core and caches with other guests, so two vCPUs can
// differ; a bench that compares a computation on one vCPU with the same on another (a worker
// process against a plain loop: bench/rl/compute_cpu.hpp) measures that difference too. Prints one
// JSON object: per window, each CPU's mean chunk time (ms) and spread = slowest / fastest; over
// all windows spread_median, spread_max and the share of windows whose spread is over 1.05 and
// over 1.10 (a last window shorter than half of --window is left out). It times one CPU at a time
// while the others idle, so it shows how fast each computes alone, not how two that are busy at
// once slow each other. Run alone: anything else running shows up as a slow CPU.
#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <chrono>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

namespace {

using Clock = std::chrono::steady_clock;

bool pin(int cpu) {
  cpu_set_t s;
  CPU_ZERO(&s);
  CPU_SET(cpu, &s);
  return ::sched_setaffinity(0, sizeof s, &s) == 0;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 30, window_s = 1;
  std::size_t kib = 64;
  CLI::App app{"how fast each CPU computes the same chunk, in turn, over time"};
  app.add_option("--seconds", seconds, "how long to measure")->check(CLI::Range(0.1, 86400.0));
  app.add_option("--window", window_s, "seconds per window")->check(CLI::Range(0.01, 3600.0));
  app.add_option("--kib", kib, "the buffer (KiB): small enough to stay in a core's cache")->check(CLI::Range(4, 1 << 20));
  CLI11_PARSE(app, argc, argv);

  cpu_set_t start;
  CPU_ZERO(&start);
  if (::sched_getaffinity(0, sizeof start, &start) != 0) {
    std::cerr << "vcpu_speed: sched_getaffinity: " << std::strerror(errno) << "\n";
    return 1;
  }
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &start)) cpus.push_back(c);

  std::vector<float> a(kib * 256, 1.0f), b(kib * 256, 0.5f);
  auto chunk = [&] {   // ~0.15 ms at 64 KiB on this VM's vCPUs (AVX-512): many turns per window
    for (int pass = 0; pass < 64; ++pass)
      for (std::size_t i = 0; i < a.size(); ++i) a[i] = a[i] * 0.999f + b[i];
  };
  nlohmann::ordered_json windows = nlohmann::ordered_json::array();
  std::vector<double> spreads;   // as printed (rounded)
  const auto t0 = Clock::now();
  const auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  while (elapsed() < seconds) {
    std::vector<double> sum(cpus.size(), 0.0);
    std::vector<int> n(cpus.size(), 0);
    const double begin = elapsed();
    const double end = std::min(seconds, begin + window_s);
    while (elapsed() < end) {
      for (std::size_t k = 0; k < cpus.size(); ++k) {
        if (!pin(cpus[k])) {
          std::cerr << "vcpu_speed: sched_setaffinity(" << cpus[k] << "): " << std::strerror(errno) << "\n";
          return 1;
        }
        chunk();   // once untimed: the buffer follows the thread to this CPU's cache
        const auto t = Clock::now();
        chunk();
        sum[k] += std::chrono::duration<double, std::milli>(Clock::now() - t).count();
        ++n[k];
      }
    }
    if (elapsed() - begin < window_s / 2 || *std::min_element(n.begin(), n.end()) == 0) break;   // the cut-off end
    nlohmann::ordered_json w;
    w["t_s"] = std::round(elapsed() * 10) / 10;
    double lo = 1e300, hi = 0;
    for (std::size_t k = 0; k < cpus.size(); ++k) {
      const double ms = sum[k] / std::max(1, n[k]);
      w["ms"][std::to_string(cpus[k])] = std::round(ms * 1e4) / 1e4;
      lo = std::min(lo, ms);
      hi = std::max(hi, ms);
    }
    const double spread = std::round((lo > 0 ? hi / lo : 1.0) * 1000) / 1000;
    w["spread"] = spread;
    spreads.push_back(spread);
    windows.push_back(w);
  }
  if (spreads.empty()) {
    std::cerr << "vcpu_speed: no whole window: --seconds must be at least half of --window\n";
    return 2;
  }
  const auto share_over = [&](double x) {
    return std::round(double(std::count_if(spreads.begin(), spreads.end(), [&](double s) { return s > x; })) / double(spreads.size()) * 1000) /
           1000;
  };
  nlohmann::ordered_json out;
  out["bench"] = "vcpu_speed";
  out["cpus"] = cpus;
  out["kib"] = kib;
  out["window_s"] = window_s;
  out["windows"] = windows;
  out["spread_median"] = median(spreads);   // spreads are rounded already, as printed
  out["spread_max"] = *std::max_element(spreads.begin(), spreads.end());
  out["share_over_1_05"] = share_over(1.05);
  out["share_over_1_10"] = share_over(1.10);
  out["checksum"] = a[a.size() / 2];   // keeps the arithmetic from being optimised away
  std::cout << out.dump() << std::endl;
  return 0;
}
