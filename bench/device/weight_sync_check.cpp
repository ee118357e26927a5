// Device check of the weight store's GPU paths (weights/src/gpu_sync.cpp): CUDA IPC from a
// publisher process to 1, 2, 4 reader processes on one GPU (each copies the version device-to-
// device into its own buffer), and an NCCL broadcast over every visible GPU (one rank per GPU, one
// thread each). Checks bytes, times each against cudaMemcpy D2D of the same size. Prints a table
// last. Exit: 0 ok, 1 a check failed, 2 no usable GPU (or built without CUDA/NCCL).
//   weight_sync_check                    the publisher / driver
//   weight_sync_check --reader RFD WFD   a reader (started by the driver; CUDA is not fork-safe)
#include <cuda_runtime_api.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "gpu_sync.hpp"

namespace gpu = troupe::detail::weights::gpu;
using Clock = std::chrono::steady_clock;
extern char** environ;

namespace {

struct Order { gpu::IpcHandle handle; int go; };   // go = 0: quit
struct Reply { double seconds; unsigned char first, last; int ok; };

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

int reader(int rfd, int wfd) {
  Order o;
  while (read(rfd, &o, sizeof o) == ssize_t(sizeof o) && o.go) {
    Reply r{0, 0, 0, 0};
    std::string err;
    void* dst = nullptr;
    auto m = gpu::IpcMapping::open(o.handle, &err);
    if (m && cudaMalloc(&dst, o.handle.nbytes) == cudaSuccess) {
      auto t0 = Clock::now();
      r.ok = m->copy_to(dst, &err) && cudaDeviceSynchronize() == cudaSuccess;
      r.seconds = since(t0);
      cudaMemcpy(&r.first, dst, 1, cudaMemcpyDeviceToHost);
      cudaMemcpy(&r.last, static_cast<char*>(dst) + o.handle.nbytes - 1, 1, cudaMemcpyDeviceToHost);
      cudaFree(dst);
    }
    if (!r.ok) std::fprintf(stderr, "reader: %s\n", err.c_str());
    m.reset();
    (void)!write(wfd, &r, sizeof r);
  }
  return 0;
}

struct Child { pid_t pid; int to, from; };

Child spawn_reader(const char* self) {
  int down[2], up[2];
  if (pipe(down) != 0 || pipe(up) != 0) std::exit(3);
  std::string a = std::to_string(down[0]), b = std::to_string(up[1]);
  char* argv[] = {const_cast<char*>(self), const_cast<char*>("--reader"), a.data(), b.data(), nullptr};
  pid_t pid;
  if (posix_spawn(&pid, self, nullptr, nullptr, argv, environ) != 0) std::exit(3);
  close(down[0]);
  close(up[1]);
  return {pid, down[1], up[0]};
}

double d2d_gbps(void* a, void* b, std::size_t n) {
  cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice);
  cudaDeviceSynchronize();
  auto t0 = Clock::now();
  for (int i = 0; i < 3; ++i) cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice);
  cudaDeviceSynchronize();
  return 3.0 * double(n) / since(t0) / 1e9;
}

double nccl_gbps(int ndev, std::size_t n, bool* ok) {
  std::string err;
  auto id = gpu::NcclBroadcaster::make_id(&err);
  if (!id) { std::fprintf(stderr, "nccl id: %s\n", err.c_str()); *ok = false; return 0; }
  std::vector<double> secs(std::size_t(ndev), 0);
  std::vector<std::thread> ts;
  for (int r = 0; r < ndev; ++r) {
    ts.emplace_back([&, r] {
      std::string e;
      auto b = gpu::NcclBroadcaster::create(*id, r, ndev, r, std::chrono::seconds(60), &e);
      void* buf = nullptr;
      if (!b || cudaMalloc(&buf, n) != cudaSuccess) { std::fprintf(stderr, "nccl rank %d: %s\n", r, e.c_str()); *ok = false; return; }
      cudaMemset(buf, r == 0 ? 0x5a : 0, n);
      cudaDeviceSynchronize();
      bool good = b->broadcast(buf, n, 0, 64u << 20, std::chrono::seconds(60), &e);   // warm-up
      auto t0 = Clock::now();
      good = good && b->broadcast(buf, n, 0, 64u << 20, std::chrono::seconds(60), &e);
      secs[std::size_t(r)] = since(t0);
      unsigned char x = 0;
      cudaMemcpy(&x, static_cast<char*>(buf) + n - 1, 1, cudaMemcpyDeviceToHost);
      if (!good || x != 0x5a) { std::fprintf(stderr, "nccl rank %d: %s byte %d\n", r, e.c_str(), x); *ok = false; }
      cudaFree(buf);
      b.reset();
    });
  }
  for (auto& t : ts) t.join();
  double worst = 0;
  for (double s : secs) worst = std::max(worst, s);
  return worst > 0 ? double(n) / worst / 1e9 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::strcmp(argv[1], "--reader") == 0) return reader(std::atoi(argv[2]), std::atoi(argv[3]));
  std::string err;
  if (!gpu::compiled()) { std::printf("no GPU path: built without CUDA/NCCL\n"); return 2; }
  int ndev = gpu::device_count(&err);
  if (ndev == 0) { std::printf("no GPU: %s\n", err.c_str()); return 2; }
  std::vector<Child> kids;
  for (int i = 0; i < 4; ++i) kids.push_back(spawn_reader(argv[0]));   // before this process uses CUDA much
  cudaSetDevice(0);
  bool all_ok = true;
  std::vector<std::string> rows;
  for (std::size_t mib : {64, 512, 2048}) {
    std::size_t n = mib << 20;
    void *src = nullptr, *tmp = nullptr;
    if (cudaMalloc(&src, n) != cudaSuccess || cudaMalloc(&tmp, n) != cudaSuccess) { all_ok = false; break; }
    cudaMemset(src, 0x3c, n);
    cudaDeviceSynchronize();
    double base = d2d_gbps(src, tmp, n);
    cudaFree(tmp);
    auto h = gpu::export_buffer(src, n, 0, &err);
    if (!h) { std::printf("ipc export: %s\n", err.c_str()); all_ok = false; cudaFree(src); break; }
    for (int readers : {1, 2, 4}) {
      for (int warm = 0; warm < 2; ++warm) {   // the first round opens the handles
        Order o{*h, 1};
        auto t0 = Clock::now();
        for (int i = 0; i < readers; ++i) (void)!write(kids[std::size_t(i)].to, &o, sizeof o);
        bool ok = true;
        for (int i = 0; i < readers; ++i) {
          Reply r{};
          ok = read(kids[std::size_t(i)].from, &r, sizeof r) == ssize_t(sizeof r) && r.ok && r.first == 0x3c && r.last == 0x3c && ok;
        }
        double s = since(t0);
        if (!warm) continue;
        all_ok = all_ok && ok;
        char line[200];
        std::snprintf(line, sizeof line, "cuda_ipc    %6zu MiB  readers %d  %8.4f s  %8.1f GB/s per reader  d2d %7.1f GB/s  %s",
                      mib, readers, s, double(n) / s / 1e9, base, ok ? "ok" : "FAIL");
        rows.push_back(line);
      }
    }
    cudaFree(src);
    bool ok = true;
    double g = nccl_gbps(ndev, n, &ok);
    all_ok = all_ok && ok;
    char line[200];
    std::snprintf(line, sizeof line, "nccl_bcast  %6zu MiB  ranks   %d  %8.4f s  %8.1f GB/s (bus)        d2d %7.1f GB/s  %s%s",
                  mib, ndev, g > 0 ? double(n) / g / 1e9 : 0.0, g, base, ok ? "ok" : "FAIL",
                  ndev == 1 ? "  (1 GPU: no peer, NCCL copies locally)" : "");
    rows.push_back(line);
  }
  for (auto& k : kids) {
    Order quit{};
    (void)!write(k.to, &quit, sizeof quit);
    waitpid(k.pid, nullptr, 0);
  }
  std::printf("\n== weight sync on GPU (%d device%s)\n", ndev, ndev == 1 ? "" : "s");
  for (auto& r : rows) std::printf("%s\n", r.c_str());
  return all_ok ? 0 : 1;
}
