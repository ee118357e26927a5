// Checks the CUDA kernels against their CPU twins and times them against the HBM bandwidth floor.
// Built and run by bench/device/kernels.sh; writes a JSON summary to argv[1] and prints one line
// per kernel. Exit status 1 when any check fails.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "troupe/kernels/kernels.hpp"

namespace tk = troupe::kernels;

namespace {

#define CK(expr)                                                                           \
  do {                                                                                     \
    cudaError_t e_ = (expr);                                                               \
    if (e_ != cudaSuccess) {                                                               \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(e_)); \
      std::exit(2);                                                                        \
    }                                                                                      \
  } while (0)

void must(const tk::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s failed: %s\n", what, s.error().message.c_str());
    std::exit(2);
  }
}

template <typename T>
struct Dev {  // a device copy of a host vector
  T* p = nullptr;
  size_t n = 0;
  explicit Dev(const std::vector<T>& h) : n(h.size()) {
    CK(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)));
    if (n) CK(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  }
  explicit Dev(size_t count) : n(count) {
    CK(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)));
    CK(cudaMemset(p, 0xff, std::max<size_t>(n, 1) * sizeof(T)));  // poison: NaN for floats
  }
  std::vector<T> host() const {
    std::vector<T> h(n);
    if (n) CK(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
  ~Dev() { cudaFree(p); }
};

// Mean device time in microseconds over `iters` launches after 3 warm-ups.
double time_us(const std::function<void()>& fn, int iters = 20) {
  for (int i = 0; i < 3; ++i) fn();
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  CK(cudaEventRecord(a));
  for (int i = 0; i < iters; ++i) fn();
  CK(cudaEventRecord(b));
  CK(cudaEventSynchronize(b));
  float ms = 0.0f;
  CK(cudaEventElapsedTime(&ms, a, b));
  CK(cudaGetLastError());
  return 1000.0 * ms / iters;
}

// Device-to-device copy bandwidth (read + write bytes per second): the practical HBM peak.
double measure_bandwidth() {
  const size_t bytes = size_t(1) << 30;
  void *a, *b;
  CK(cudaMalloc(&a, bytes));
  CK(cudaMalloc(&b, bytes));
  CK(cudaMemset(a, 1, bytes));
  const double us = time_us([&] { CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice)); }, 10);
  cudaFree(a);
  cudaFree(b);
  return 2.0 * bytes / (us * 1e-6);
}

// Largest |gpu - cpu| / (1 + |cpu|); NaN where exactly one side is NaN counts as infinite.
double max_rel(const std::vector<float>& gpu, const std::vector<float>& cpu) {
  double worst = 0.0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    if (std::isnan(cpu[i]) || std::isnan(gpu[i])) {
      if (std::isnan(cpu[i]) != std::isnan(gpu[i])) return INFINITY;
      continue;
    }
    if (cpu[i] == gpu[i]) continue;
    worst = std::max(worst, std::fabs(double(gpu[i]) - cpu[i]) / (1.0 + std::fabs(double(cpu[i]))));
  }
  return worst;
}

std::vector<float> randn(size_t n, float sigma, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

std::vector<uint8_t> random_mask(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> m(n);
  for (auto& b : m) b = (rng() % 10) < 8;
  return m;
}

struct Result {
  std::string name;
  double err, tol, us, bytes;
};

std::vector<Result> results;
double g_bw = 0.0;

void record(const std::string& name, double err, double tol, double us, double bytes) {
  results.push_back({name, err, tol, us, bytes});
  const double floor_us = bytes / g_bw * 1e6;
  std::printf("%-22s %s  err %.2e (tol %.0e)  %9.1f us  floor %8.1f us  x%.2f of floor\n",
              name.c_str(), err <= tol ? "ok  " : "FAIL", err, tol, us, floor_us, us / floor_us);
}

void check_logprob() {
  const int64_t rows = 4096, vocab = 32768;
  auto x = randn(static_cast<size_t>(rows * vocab), 4.0f, 1);
  for (int64_t v = 0; v < vocab; v += 7) x[size_t(v)] = -INFINITY;  // row 0: masked vocab
  std::vector<int64_t> tok(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) tok[size_t(r)] = (r * 7919) % vocab;
  std::vector<float> lp(static_cast<size_t>(rows)), h(static_cast<size_t>(rows));
  must(tk::logprob_gather(x.data(), rows, vocab, tok.data(), lp.data(), h.data()), "cpu logprob");
  Dev<float> dx(x), dlp(static_cast<size_t>(rows)), dh(static_cast<size_t>(rows));
  Dev<int64_t> dt(tok);
  must(tk::cuda::logprob_gather(dx.p, rows, vocab, dt.p, dlp.p, dh.p), "cuda logprob");
  CK(cudaDeviceSynchronize());
  const double err = std::max(max_rel(dlp.host(), lp), max_rel(dh.host(), h));
  const double bytes = rows * vocab * 4.0 + rows * 16.0;
  record("logprob_entropy_f32", err, 2e-5, time_us([&] { (void)tk::cuda::logprob_gather(dx.p, rows, vocab, dt.p, dlp.p, dh.p); }), bytes);
  record("logprob_gather_f32", max_rel(dlp.host(), lp), 2e-5, time_us([&] { (void)tk::cuda::logprob_gather(dx.p, rows, vocab, dt.p, dlp.p); }), bytes - rows * 4.0);
  std::vector<tk::bf16> x16(x.size());
  for (size_t i = 0; i < x.size(); ++i) x16[i] = tk::to_bf16(x[i]);
  must(tk::logprob_gather(x16.data(), rows, vocab, tok.data(), lp.data(), h.data()), "cpu logprob bf16");
  Dev<tk::bf16> dx16(x16);
  must(tk::cuda::logprob_gather(dx16.p, rows, vocab, dt.p, dlp.p, dh.p), "cuda logprob bf16");
  CK(cudaDeviceSynchronize());
  const double err16 = std::max(max_rel(dlp.host(), lp), max_rel(dh.host(), h));
  record("logprob_gather_bf16", err16, 2e-5, time_us([&] { (void)tk::cuda::logprob_gather(dx16.p, rows, vocab, dt.p, dlp.p); }), rows * vocab * 2.0 + rows * 12.0);
}

void check_advantages() {
  const int64_t groups = 1 << 20, g = 16;
  auto s = randn(static_cast<size_t>(groups * g), 1.0f, 2);
  std::vector<float> a(s.size()), m(static_cast<size_t>(groups)), sd(static_cast<size_t>(groups));
  must(tk::group_advantages(s.data(), groups, g, a.data(), m.data(), sd.data()), "cpu adv");
  Dev<float> ds(s), da(s.size()), dm(static_cast<size_t>(groups)), dsd(static_cast<size_t>(groups));
  must(tk::cuda::group_advantages(ds.p, groups, g, da.p, dm.p, dsd.p), "cuda adv");
  CK(cudaDeviceSynchronize());
  const double err = std::max({max_rel(da.host(), a), max_rel(dm.host(), m), max_rel(dsd.host(), sd)});
  record("group_advantages", err, 2e-5, time_us([&] { (void)tk::cuda::group_advantages(ds.p, groups, g, da.p); }), groups * g * 8.0);
}

// The CPU twin and the CUDA kernel on one batch: max relative error of advantages and returns.
double gae_err(const std::vector<float>& r, const std::vector<float>& v, const std::vector<uint8_t>& mask,
               int64_t rows, int64_t tokens, const tk::GaeOptions& o) {
  const size_t n = size_t(rows * tokens);
  const uint8_t* m = mask.empty() ? nullptr : mask.data();
  std::vector<float> adv(n), ret(n);
  must(tk::gae(r.data(), v.data(), m, rows, tokens, adv.data(), ret.data(), o), "cpu gae");
  Dev<float> dr(r), dv(v), dadv(n), dret(n);
  Dev<uint8_t> dm(mask);
  must(tk::cuda::gae(dr.p, dv.p, m ? dm.p : nullptr, rows, tokens, dadv.p, dret.p, o), "cuda gae");
  CK(cudaDeviceSynchronize());
  return std::max(max_rel(dadv.host(), adv), max_rel(dret.host(), ret));
}

void check_gae() {
  // Shapes around the kernel's tile (32 lanes x 16 tokens) and lane chunks, with the mask random,
  // absent, all-masked rows, left padding and a single valid token.
  double edge_err = 0.0;
  const int64_t shapes[][2] = {{1, 1}, {3, 7}, {5, 33}, {4, 511}, {4, 512}, {4, 513}, {3, 5000}, {70, 100}};
  uint64_t seed = 100;
  for (const auto& s : shapes) {
    const int64_t rows = s[0], tokens = s[1];
    const size_t n = size_t(rows * tokens);
    auto r = randn(n, 0.3f, seed++), v = randn(n, 1.0f, seed++);
    auto mask = random_mask(n, seed++);
    for (int64_t t = 0; t < tokens; ++t) mask[size_t(t)] = 0;                                      // row 0: all masked
    if (rows > 1) for (int64_t t = 0; t < tokens / 2; ++t) mask[size_t(tokens + t)] = 0;           // row 1: left padding
    if (rows > 2) for (int64_t t = 0; t < tokens; ++t) mask[size_t(2 * tokens + t)] = t == tokens / 3;  // row 2: one token
    edge_err = std::max({edge_err, gae_err(r, v, mask, rows, tokens, {0.99f, 0.95f}),
                         gae_err(r, v, {}, rows, tokens, {1.0f, 1.0f})});
  }
  std::printf("gae edge shapes: max err %.2e\n", edge_err);
  const int64_t rows = 512, tokens = 1024;   // a PPO batch: 512 responses of 1024 tokens
  const size_t n = size_t(rows * tokens);
  auto r = randn(n, 0.3f, 11), v = randn(n, 1.0f, 12);
  auto mask = random_mask(n, 13);
  const tk::GaeOptions o{0.99f, 0.95f};
  std::vector<float> adv(n), ret(n);
  must(tk::gae(r.data(), v.data(), mask.data(), rows, tokens, adv.data(), ret.data(), o), "cpu gae");
  Dev<float> dr(r), dv(v), dadv(n), dret(n);
  Dev<uint8_t> dm(mask);
  must(tk::cuda::gae(dr.p, dv.p, dm.p, rows, tokens, dadv.p, dret.p, o), "cuda gae");
  CK(cudaDeviceSynchronize());
  const double err = std::max({max_rel(dadv.host(), adv), max_rel(dret.host(), ret), edge_err});
  record("gae", err, 1e-5, time_us([&] { (void)tk::cuda::gae(dr.p, dv.p, dm.p, rows, tokens, dadv.p, dret.p, o); }),
         double(n) * (4 + 4 + 1 + 4 + 4));
}

void check_kl() {
  const int64_t n = 4096 * 4096;
  auto lp = randn(static_cast<size_t>(n), 1.0f, 3), ref = lp;
  auto noise = randn(static_cast<size_t>(n), 0.3f, 4);
  for (size_t i = 0; i < lp.size(); ++i) lp[i] = -std::fabs(lp[i]) * 3, ref[i] = lp[i] + noise[i];
  auto mask = random_mask(static_cast<size_t>(n), 5);
  std::vector<float> kl(static_cast<size_t>(n));
  must(tk::kl_penalty(lp.data(), ref.data(), mask.data(), n, kl.data()), "cpu kl");
  Dev<float> dlp(lp), dref(ref), dkl(static_cast<size_t>(n));
  Dev<uint8_t> dm(mask);
  must(tk::cuda::kl_penalty(dlp.p, dref.p, dm.p, n, dkl.p), "cuda kl");
  CK(cudaDeviceSynchronize());
  record("kl_k3", max_rel(dkl.host(), kl), 2e-5, time_us([&] { (void)tk::cuda::kl_penalty(dlp.p, dref.p, dm.p, n, dkl.p); }), n * 13.0);
}

void check_policy_loss() {
  const int64_t rows = 4096, tokens = 4096, n = rows * tokens;
  auto lp = randn(static_cast<size_t>(n), 1.0f, 6), old = lp, adv = randn(static_cast<size_t>(n), 1.0f, 7);
  auto drift = randn(static_cast<size_t>(n), 0.3f, 8);
  for (size_t i = 0; i < lp.size(); ++i) lp[i] = -std::fabs(lp[i]) * 3, old[i] = lp[i] + drift[i];
  auto mask = random_mask(static_cast<size_t>(n), 9);
  std::vector<float> grad(static_cast<size_t>(n));
  float loss = 0, clip = 0;
  const tk::PolicyLossOptions o{0.2f, 0.28f, 3.0f, tk::LossAggregation::kSeqMeanTokenMean};
  must(tk::policy_loss(lp.data(), old.data(), adv.data(), mask.data(), rows, tokens, &loss, grad.data(), &clip, o), "cpu loss");
  Dev<float> dlp(lp), dold(old), dadv(adv), dg(static_cast<size_t>(n)), dloss(2);
  Dev<uint8_t> dm(mask);
  must(tk::cuda::policy_loss(dlp.p, dold.p, dadv.p, dm.p, rows, tokens, dloss.p, dg.p, dloss.p + 1, o), "cuda loss");
  CK(cudaDeviceSynchronize());
  // Gradients are ~1e-8 each (weights 1/(n_s S)): compare them relative to the largest one.
  // The gradient of a token jumps (to 0) where its ratio crosses 1 - clip_low, 1 + clip_high or
  // the dual clip. Within 1e-6 of such an edge the two exps (the CPU's polynomial and CUDA's expf,
  // each within 3e-7) may fall on either side, so both answers are right: those tokens are left
  // out of the gradient comparison, counted, and must stay rare (at most 1 in 10^5).
  const double edges_at[] = {1.0 - o.clip_low, 1.0 + o.clip_high, double(o.dual_clip)};
  auto at_edge = [&](size_t i) {
    const double r = std::exp(double(lp[i] - old[i]));
    for (double e : edges_at) if (std::fabs(r - e) <= 1e-6 * e) return true;
    return false;
  };
  const auto g_gpu = dg.host();
  double gmax = 0, gerr = 0;
  size_t edge_tokens = 0;
  for (size_t i = 0; i < grad.size(); ++i) gmax = std::max(gmax, double(std::fabs(grad[i])));
  for (size_t i = 0; i < grad.size(); ++i) {
    if (at_edge(i)) { ++edge_tokens; continue; }
    gerr = std::max(gerr, std::fabs(double(g_gpu[i]) - grad[i]) / gmax);
  }
  const auto sc = dloss.host();
  double err = std::max({gerr, double(std::fabs(sc[0] - loss)) / (1 + std::fabs(loss)), double(std::fabs(sc[1] - clip))});
  if (edge_tokens * 100000 > grad.size()) err = std::max(err, 1.0);
  std::fprintf(stderr, "policy_loss: loss gpu %.7g cpu %.7g, clip fraction gpu %.7g cpu %.7g, grad err %.3g of max %.3g"
               " (%zu of %zu tokens at a clip edge left out)\n",
               double(sc[0]), double(loss), double(sc[1]), double(clip), gerr, gmax, edge_tokens, grad.size());
  record("policy_loss", err, 2e-5, time_us([&] { (void)tk::cuda::policy_loss(dlp.p, dold.p, dadv.p, dm.p, rows, tokens, dloss.p, dg.p, dloss.p + 1, o); }), n * 17.0);
}

void check_bucket(tk::WireFormat wire, const char* name) {
  const int64_t count = 64, rows = 1024, cols = 1024;
  std::vector<tk::TensorSpec> specs;
  std::vector<std::vector<float>> host;
  std::vector<Dev<float>*> dev, back;
  std::vector<const void*> hin, din;
  std::vector<void*> dout;
  for (int i = 0; i < count; ++i) {
    specs.push_back({"w" + std::to_string(i), rows, cols, tk::DType::kF32, wire});
    host.push_back(randn(static_cast<size_t>(rows * cols), 0.05f, 100 + i));
    dev.push_back(new Dev<float>(host.back()));
    back.push_back(new Dev<float>(static_cast<size_t>(rows * cols)));
    hin.push_back(host.back().data()), din.push_back(dev.back()->p), dout.push_back(back.back()->p);
  }
  tk::BucketLayout layout;
  must(tk::plan_bucket(specs, &layout), "plan");
  std::vector<std::byte> cpu_bucket(layout.bytes);
  must(tk::pack_bucket(layout, hin, cpu_bucket.data()), "cpu pack");
  std::byte* db = nullptr;
  CK(cudaMalloc(&db, layout.bytes));
  CK(cudaMemset(db, 0xAB, layout.bytes));
  must(tk::cuda::pack_bucket(layout, din, db), "cuda pack");
  must(tk::cuda::unpack_bucket(layout, db, dout), "cuda unpack");
  CK(cudaDeviceSynchronize());
  std::vector<std::byte> gpu_bucket(layout.bytes);
  CK(cudaMemcpy(gpu_bucket.data(), db, layout.bytes, cudaMemcpyDeviceToHost));
  size_t differ = 0;  // bytes that differ from the CPU twin's bucket
  for (size_t i = 0; i < layout.bytes; ++i) differ += gpu_bucket[i] != cpu_bucket[i];
  // Unpack: the GPU's tensors (from the GPU bucket) against the CPU's (from the CPU bucket).
  std::vector<std::vector<float>> cpu_out(static_cast<size_t>(count), std::vector<float>(static_cast<size_t>(rows * cols)));
  std::vector<void*> cpu_ptrs;
  for (auto& v : cpu_out) cpu_ptrs.push_back(v.data());
  must(tk::unpack_bucket(layout, cpu_bucket.data(), cpu_ptrs), "cpu unpack");
  double unpack_err = 0.0;
  for (int i = 0; i < count; ++i) unpack_err = std::max(unpack_err, max_rel(back[size_t(i)]->host(), cpu_out[size_t(i)]));
  const double differ_share = double(differ) / double(layout.bytes);
  const double bytes = count * rows * cols * 4.0 + double(layout.bytes);
  record(std::string(name) + "_pack", differ_share, 1e-6, time_us([&] { (void)tk::cuda::pack_bucket(layout, din, db); }), bytes);
  record(std::string(name) + "_unpack", unpack_err, 1e-2, time_us([&] { (void)tk::cuda::unpack_bucket(layout, db, dout); }), bytes);
  cudaFree(db);
  for (auto* d : dev) delete d;
  for (auto* d : back) delete d;
}

}  // namespace

int main(int argc, char** argv) {
  if (!tk::cuda_available()) {
    std::fprintf(stderr, "%s\n", tk::cuda::device_status().error().message.c_str());
    return 2;
  }
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  g_bw = measure_bandwidth();
  std::printf("device %s, %d SMs; device-to-device copy %.0f GB/s (read+write)\n", prop.name,
              prop.multiProcessorCount, g_bw / 1e9);
  check_logprob();
  check_advantages();
  check_gae();
  check_kl();
  check_policy_loss();
  check_bucket(tk::WireFormat::kBF16, "bucket_bf16");
  check_bucket(tk::WireFormat::kInt8Row, "bucket_int8");
  bool ok = true;
  std::string json = "{\"device\": \"" + std::string(prop.name) + "\", \"copy_gbps\": " + std::to_string(g_bw / 1e9) + ", \"kernels\": {";
  for (size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    ok = ok && r.err <= r.tol;
    json += (i ? ", \"" : "\"") + r.name + "\": {\"us\": " + std::to_string(r.us) + ", \"floor_us\": " +
            std::to_string(r.bytes / g_bw * 1e6) + ", \"err\": " + std::to_string(r.err) +
            ", \"ok\": " + (r.err <= r.tol ? "true" : "false") + "}";
  }
  json += "}}";
  if (argc > 1) {
    FILE* f = std::fopen(argv[1], "w");
    if (f) std::fputs(json.c_str(), f), std::fclose(f);
  }
  return ok ? 0 : 1;
}
