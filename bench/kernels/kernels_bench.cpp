// CPU kernels against composed libtorch ops, same inputs, same thread count, same run.
// Prints one JSON object (last line): per kernel its median time, GB/s (bytes the kernel must
// move: inputs read once plus outputs written once), torch's median time, and the speedup.
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <vector>

#include "troupe/kernels/kernels.hpp"

namespace tk = troupe::kernels;
using nlohmann::json;

namespace {

// Median wall time in ms of `reps` runs after one warm-up.
double median_ms(const std::function<void()>& fn, int reps) {
  fn();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

void must(const tk::Status& s) {
  if (!s.ok()) throw std::runtime_error(s.error().message);
}

json entry(double ms, double bytes, double torch_ms, double max_diff) {
  return {{"ms", ms}, {"gbps", bytes / (ms * 1e6)}, {"torch_ms", torch_ms},
          {"speedup_vs_torch", torch_ms / ms}, {"max_abs_diff_vs_torch", max_diff}};
}

double max_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().nan_to_num(0.0, 0.0, 0.0).max().item<double>();
}

json bench_logprob(int reps) {
  const int64_t rows = 4096, vocab = 32768;
  auto logits = torch::randn({rows, vocab}) * 4;
  auto tokens = torch::randint(vocab, {rows}, torch::kLong);
  auto lp = torch::empty({rows}), h = torch::empty({rows});
  json out;
  // fp32, logprob only: torch log_softmax then gather.
  torch::Tensor ref;
  const double t_ms = median_ms([&] { ref = torch::log_softmax(logits, -1).gather(1, tokens.unsqueeze(1)).squeeze(1); }, reps);
  const double k_ms = median_ms([&] { must(tk::logprob_gather(logits.data_ptr<float>(), rows, vocab, tokens.data_ptr<int64_t>(), lp.data_ptr<float>())); }, reps);
  out["logprob_gather"] = entry(k_ms, rows * vocab * 4.0 + rows * 12.0, t_ms, max_diff(lp, ref));
  out["logprob_gather"]["rows"] = rows, out["logprob_gather"]["vocab"] = vocab;
  // fp32 with entropy: torch adds -(exp(lsm) * lsm).sum(-1).
  torch::Tensor ref_h;
  const double te_ms = median_ms([&] {
    auto lsm = torch::log_softmax(logits, -1);
    ref = lsm.gather(1, tokens.unsqueeze(1)).squeeze(1);
    ref_h = -(lsm.exp() * lsm).sum(-1);
  }, reps);
  const double ke_ms = median_ms([&] { must(tk::logprob_gather(logits.data_ptr<float>(), rows, vocab, tokens.data_ptr<int64_t>(), lp.data_ptr<float>(), h.data_ptr<float>())); }, reps);
  out["logprob_entropy"] = entry(ke_ms, rows * vocab * 4.0 + rows * 16.0, te_ms, std::max(max_diff(lp, ref), max_diff(h, ref_h)));
  // bf16 logits: torch widens to fp32 first (what trainers do before log_softmax).
  auto logits16 = logits.to(torch::kBFloat16);
  logits = torch::Tensor();
  const double tb_ms = median_ms([&] { ref = torch::log_softmax(logits16.to(torch::kFloat), -1).gather(1, tokens.unsqueeze(1)).squeeze(1); }, reps);
  const auto* p16 = reinterpret_cast<const tk::bf16*>(logits16.data_ptr<at::BFloat16>());
  const double kb_ms = median_ms([&] { must(tk::logprob_gather(p16, rows, vocab, tokens.data_ptr<int64_t>(), lp.data_ptr<float>())); }, reps);
  out["logprob_gather_bf16"] = entry(kb_ms, rows * vocab * 2.0 + rows * 12.0, tb_ms, max_diff(lp, ref));
  return out;
}

json bench_advantages(int reps) {
  const int64_t groups = 1 << 16, g = 16;
  auto scores = torch::rand({groups * g});
  auto adv = torch::empty_like(scores);
  torch::Tensor ref;
  const double t_ms = median_ms([&] {
    auto s = scores.view({groups, g});
    ref = ((s - s.mean(1, true)) / (s.std(1, true, true) + 1e-6)).view(-1);
  }, reps);
  const double k_ms = median_ms([&] { must(tk::group_advantages(scores.data_ptr<float>(), groups, g, adv.data_ptr<float>())); }, reps);
  json e = entry(k_ms, groups * g * 8.0, t_ms, max_diff(adv, ref));
  e["groups"] = groups, e["group_size"] = g;
  return e;
}

json bench_kl(int reps) {
  const int64_t n = 4096 * 4096;
  auto logp = -torch::rand({n}) * 5, ref_logp = logp + torch::randn({n}) * 0.3;
  auto mask = torch::rand({n}) < 0.8;
  auto kl = torch::empty({n});
  torch::Tensor ref;
  const double t_ms = median_ms([&] {
    auto lr = (ref_logp - logp).clamp(-20, 20);
    ref = (lr.exp() - lr - 1) * mask;
  }, reps);
  const double k_ms = median_ms([&] {
    must(tk::kl_penalty(logp.data_ptr<float>(), ref_logp.data_ptr<float>(), reinterpret_cast<const uint8_t*>(mask.data_ptr<bool>()), n, kl.data_ptr<float>()));
  }, reps);
  json e = entry(k_ms, n * 13.0, t_ms, max_diff(kl, ref));
  e["n"] = n, e["estimator"] = "k3";
  return e;
}

json bench_policy_loss(int reps) {
  const int64_t rows = 1024, tokens = 4096;
  auto logp = -torch::rand({rows, tokens}) * 5, old = logp + torch::randn({rows, tokens}) * 0.3;
  auto adv = torch::randn({rows, tokens});
  auto mask = torch::rand({rows, tokens}) < 0.8;
  auto grad = torch::empty({rows, tokens});
  float loss = 0.0f;
  torch::Tensor ref_grad, ref_loss;
  const double t_ms = median_ms([&] {  // loss + autograd backward = the kernel's two outputs
    auto x = logp.detach().requires_grad_(true);
    auto ratio = (x - old).clamp(-20, 20).exp();
    auto l = torch::max(-adv * ratio, -adv * ratio.clamp(0.8, 1.2));
    ref_loss = (l * mask).sum() / mask.sum();
    ref_loss.backward();
    ref_grad = x.grad();
  }, reps);
  const double k_ms = median_ms([&] {
    must(tk::policy_loss(logp.data_ptr<float>(), old.data_ptr<float>(), adv.data_ptr<float>(), reinterpret_cast<const uint8_t*>(mask.data_ptr<bool>()), rows, tokens, &loss, grad.data_ptr<float>()));
  }, reps);
  json e = entry(k_ms, rows * tokens * 17.0, t_ms, std::max(max_diff(grad, ref_grad), std::abs(loss - ref_loss.item<double>())));
  e["rows"] = rows, e["tokens"] = tokens;
  return e;
}

// The demo's attention: 300 rows x 4 heads, 10 tokens, head width 16 (the trainer's batch), forward
// and backward, against matmul + masked softmax + matmul with autograd.
json bench_attention(int reps) {
  const int64_t b = 300, h = 4, t = 10, d = 16;
  auto q = torch::randn({b, h, t, d}), k = torch::randn({b, h, t, d}), v = torch::randn({b, h, t, d});
  auto g = torch::randn({b, h, t, d});
  auto key_mask = torch::ones({b, t}, torch::kUInt8);
  key_mask.narrow(1, 0, 3).narrow(0, 0, b / 2).zero_();   // half the rows left-padded by 3
  const float scale = 1.0f / 4.0f;
  auto causal = torch::ones({t, t}, torch::kBool).tril().view({1, 1, t, t});
  auto allowed = key_mask.to(torch::kBool).view({b, 1, 1, t}).logical_and(causal).logical_or(torch::eye(t, torch::kBool));
  torch::Tensor ref_out, ref_dq;
  const double t_ms = median_ms([&] {
    auto x = q.detach().requires_grad_(true), kk = k.detach().requires_grad_(true), vv = v.detach().requires_grad_(true);
    auto p = torch::softmax(torch::matmul(x, kk.transpose(-2, -1)).mul(scale).masked_fill(allowed.logical_not(), -INFINITY), -1);
    ref_out = torch::matmul(p, vv);
    ref_out.backward(g);
    ref_dq = x.grad();
  }, reps);
  auto probs = torch::empty({b, h, t, t}), out = torch::empty({b, h, t, d});
  auto dq = torch::empty_like(q), dk = torch::empty_like(k), dv = torch::empty_like(v);
  const tk::AttentionShape shape{b, h, t, t, d};
  const double k_ms = median_ms([&] {
    must(tk::attention_forward(q.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(), key_mask.data_ptr<uint8_t>(),
                               shape, scale, probs.data_ptr<float>(), out.data_ptr<float>()));
    must(tk::attention_backward(q.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(), probs.data_ptr<float>(),
                                g.data_ptr<float>(), shape, scale, dq.data_ptr<float>(), dk.data_ptr<float>(),
                                dv.data_ptr<float>()));
  }, reps);
  // Bytes: q, k, v, g read and out, dq, dk, dv written, probs written and read.
  json e = entry(k_ms, double(b * h * t * d) * 4 * 8 + double(b * h * t * t) * 4 * 2, t_ms,
                 std::max(max_diff(out, ref_out), max_diff(dq, ref_dq)));
  e["batch"] = b, e["heads"] = h, e["tokens"] = t, e["dim"] = d, e["pass"] = "forward + backward";
  return e;
}

json bench_bucket(int reps) {
  const int64_t n_tensors = 64, rows = 1024, cols = 1024;
  std::vector<torch::Tensor> ws;
  std::vector<const void*> in;
  std::vector<void*> out_ptrs;
  std::vector<torch::Tensor> outs;
  for (int i = 0; i < n_tensors; ++i) {
    ws.push_back(torch::randn({rows, cols}));
    outs.push_back(torch::empty({rows, cols}));
    in.push_back(ws.back().data_ptr<float>()), out_ptrs.push_back(outs.back().data_ptr<float>());
  }
  json out;
  for (auto wire : {tk::WireFormat::kBF16, tk::WireFormat::kInt8Row}) {
    std::vector<tk::TensorSpec> specs;
    for (int i = 0; i < n_tensors; ++i) specs.push_back({"w" + std::to_string(i), rows, cols, tk::DType::kF32, wire});
    tk::BucketLayout layout;
    must(tk::plan_bucket(specs, &layout));
    auto bucket = torch::empty({int64_t(layout.bytes)}, torch::kUInt8);
    auto* b = reinterpret_cast<std::byte*>(bucket.data_ptr<uint8_t>());
    const bool int8 = wire == tk::WireFormat::kInt8Row;
    const double t_ms = median_ms([&] {
      for (int i = 0; i < n_tensors; ++i) {
        const auto& e = layout.entries[size_t(i)];
        if (!int8) {
          bucket.narrow(0, int64_t(e.offset), int64_t(e.bytes)).view(torch::kBFloat16).view({rows, cols}).copy_(ws[size_t(i)]);
          continue;
        }
        auto scale = ws[size_t(i)].abs().amax(1, true) / 127;
        bucket.narrow(0, int64_t(e.offset), rows * 4).view(torch::kFloat).copy_(scale.view(-1));
        bucket.narrow(0, int64_t(e.offset + e.data_offset), rows * cols).view(torch::kInt8).view({rows, cols})
            .copy_((ws[size_t(i)] / scale).round().clamp(-127, 127));
      }
    }, reps);
    const double k_ms = median_ms([&] { must(tk::pack_bucket(layout, in, b)); }, reps);
    const double u_ms = median_ms([&] { must(tk::unpack_bucket(layout, b, out_ptrs)); }, reps);
    const double wire_bytes = double(layout.bytes), f32_bytes = n_tensors * rows * cols * 4.0;
    double diff = 0.0;
    for (int i = 0; i < n_tensors; ++i) diff = std::max(diff, max_diff(outs[size_t(i)], ws[size_t(i)]));
    const std::string name = int8 ? "bucket_int8" : "bucket_bf16";
    out[name] = entry(k_ms, f32_bytes + wire_bytes, t_ms, 0.0);
    out[name]["unpack_ms"] = u_ms;
    out[name]["unpack_gbps"] = (f32_bytes + wire_bytes) / (u_ms * 1e6);
    out[name]["max_round_trip_error"] = diff;
    out[name]["tensors"] = n_tensors, out[name]["bytes_f32"] = f32_bytes;
  }
  return out;
}

}  // namespace

int main() {
  torch::manual_seed(0);
  const int threads = tk::num_threads();
  torch::set_num_threads(threads);
  const int reps = 5;
  json result;
  result["threads"] = threads;
  result["torch_threads"] = torch::get_num_threads();
  result["timing"] = "median of 5 after a warm-up; gbps = bytes the kernel must move / time";
  result.update(bench_logprob(reps));
  result["group_advantages"] = bench_advantages(reps);
  result["kl_k3"] = bench_kl(reps);
  result["policy_loss"] = bench_policy_loss(reps);
  result["attention"] = bench_attention(reps);
  result.update(bench_bucket(reps));
  result["logprob_gather"]["target_speedup"] = 2.0;
  std::printf("%s\n", result.dump().c_str());
  return 0;
}
