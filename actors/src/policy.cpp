#include "troupe/actors/policy.hpp"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "troupe/actors/blas.hpp"
#include "troupe/actors/tensor_bridge.hpp"
#include "troupe/kernels/attention.hpp"
#include "troupe/kernels/logprob.hpp"

namespace troupe::actors {
namespace {

// Parameter order within one block; index = layer_base + field.
enum Field : std::size_t { kLn1W, kLn1B, kQkvW, kQkvB, kOutW, kOutB, kLn2W, kLn2B, kFcW, kFcB, kProjW, kProjB, kFields };
constexpr const char* kFieldNames[kFields] = {"ln1.weight", "ln1.bias", "attn.qkv.weight", "attn.qkv.bias",
                                              "attn.out.weight", "attn.out.bias", "ln2.weight", "ln2.bias",
                                              "mlp.fc.weight", "mlp.fc.bias", "mlp.proj.weight", "mlp.proj.bias"};
constexpr std::size_t kTokEmb = 0, kPosEmb = 1, kFirstBlock = 2;   // then lnf.weight, lnf.bias, head.weight

void check_config(const PolicyConfig& c) {
  if (c.vocab_size < 2 || c.context < 2 || c.layers < 1 || c.d_model < 1 || c.heads < 1 || c.d_ff < 0)
    throw std::invalid_argument("PolicyConfig: sizes must be positive");
  if (c.d_model % c.heads != 0) throw std::invalid_argument("PolicyConfig: heads must divide d_model");
}

// Causal, key-masked attention through the fused kernel (kernels/attention.hpp), differentiable:
// q [B, H, Tq, D], k and v [B, H, Tk, D] (the queries are the last Tq positions), key_mask [B, Tk]
// u8. The same mask and math as masked_fill(-inf) + softmax + matmul, at a fraction of the cost
// for short sequences.
class FusedAttention : public torch::autograd::Function<FusedAttention> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, const at::Tensor& key_mask, double scale) {
    auto qc = q.contiguous();
    // A KV cache's first Tk positions ([B, H, max_len, D] narrowed) are read in place, not copied.
    const std::int64_t rows = cache_rows(k);
    const bool in_place = rows > 0 && cache_rows(v) == rows;
    auto kc = in_place ? k : k.contiguous(), vc = in_place ? v : v.contiguous();
    kernels::AttentionShape shape{qc.size(0), qc.size(1), qc.size(2), kc.size(2), qc.size(3)};
    shape.key_rows = in_place ? rows : 0;
    auto probs = at::empty({shape.batch, shape.heads, shape.queries, shape.keys}, at::kFloat);
    auto out = at::empty_like(qc);
    check(kernels::attention_forward(qc.data_ptr<float>(), kc.data_ptr<float>(), vc.data_ptr<float>(),
                                     key_mask.data_ptr<std::uint8_t>(), shape, float(scale), probs.data_ptr<float>(),
                                     out.data_ptr<float>()), "attention_forward");
    ctx->save_for_backward({qc, kc, vc, probs});
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["key_rows"] = shape.key_rows;
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &q = saved[0], &k = saved[1], &v = saved[2], &probs = saved[3];
    const auto g = grads[0].contiguous();
    kernels::AttentionShape shape{q.size(0), q.size(1), q.size(2), k.size(2), q.size(3)};
    shape.key_rows = ctx->saved_data["key_rows"].toInt();
    auto dq = at::empty_like(q), dk = at::empty(k.sizes(), k.options()), dv = at::empty(v.sizes(), v.options());
    check(kernels::attention_backward(q.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(),
                                      probs.data_ptr<float>(), g.data_ptr<float>(), shape,
                                      float(ctx->saved_data["scale"].toDouble()), dq.data_ptr<float>(),
                                      dk.data_ptr<float>(), dv.data_ptr<float>()), "attention_backward");
    return {dq, dk, dv, at::Tensor(), at::Tensor()};
  }

 private:
  // The rows per (batch, head) tile when t [B, H, Tk, D] is the first Tk positions of a contiguous
  // [B, H, rows, D] tensor (a KV cache narrowed); 0 otherwise.
  static std::int64_t cache_rows(const at::Tensor& t) {
    const std::int64_t d = t.size(3);
    if (t.stride(3) != 1 || t.stride(2) != d || t.stride(1) % d != 0 || t.stride(0) != t.size(1) * t.stride(1)) return 0;
    return t.stride(1) / d;
  }

  static void check(const kernels::Status& st, const char* what) {
    if (!st.ok()) throw ErrorException(Error{st.error().code, std::string(what) + ": " + st.error().message});
  }
};

}  // namespace

KvCache::KvCache(const PolicyConfig& c, std::int64_t batch, std::int64_t max_len)
    : heads_(c.heads), head_dim_(c.d_model / c.heads), max_len_(max_len) {
  for (int l = 0; l < c.layers; ++l) {
    key_memory_.push_back(at::zeros({batch * heads_ * max_len * head_dim_}));
    value_memory_.push_back(at::zeros({batch * heads_ * max_len * head_dim_}));
  }
  view(batch, max_len);
}

void KvCache::view(std::int64_t batch, std::int64_t max_len) {
  const std::int64_t n = batch * heads_ * max_len * head_dim_;
  keys_.clear();
  values_.clear();
  for (std::size_t l = 0; l < key_memory_.size(); ++l) {
    keys_.push_back(key_memory_[l].narrow(0, 0, n).view({batch, heads_, max_len, head_dim_}));
    values_.push_back(value_memory_[l].narrow(0, 0, n).view({batch, heads_, max_len, head_dim_}));
  }
  max_len_ = max_len;
}

bool KvCache::reuse(std::int64_t batch, std::int64_t max_len) {
  if (batch < 1 || max_len < 1 || key_memory_.empty() || batch * heads_ * max_len * head_dim_ > key_memory_[0].numel())
    return false;
  view(batch, max_len);
  return true;
}

bool KvCache::repeat_rows(const DecodeCache& prefix, std::int64_t repeats, std::int64_t length) {
  const auto* from = dynamic_cast<const KvCache*>(&prefix);
  if (from == nullptr) return false;
  if (from->keys_.size() != keys_.size() || keys_.empty() || repeats < 1 || length < 0 || length > max_len_ ||
      length > from->max_len_ || from->keys_[0].size(0) * repeats != keys_[0].size(0) ||
      from->keys_[0].size(1) != keys_[0].size(1) || from->keys_[0].size(3) != keys_[0].size(3)) {
    throw std::invalid_argument("KvCache::repeat_rows: a prefix of other sizes");
  }
  // Row r of this cache is row r / repeats of the prefix: this cache's rows as [prefix rows,
  // repeats, ...] take the prefix broadcast over `repeats`, with no repeated copy made first.
  const std::int64_t rows = from->keys_[0].size(0);
  for (std::size_t l = 0; l < keys_.size(); ++l) {
    keys_[l].narrow(2, 0, length).unflatten(0, {rows, repeats}).copy_(from->keys_[l].narrow(2, 0, length).unsqueeze(1));
    values_[l].narrow(2, 0, length).unflatten(0, {rows, repeats}).copy_(from->values_[l].narrow(2, 0, length).unsqueeze(1));
  }
  return true;
}

Policy::Policy(const PolicyConfig& config) : Model(config) {
  check_config(config_);
  if (config_.d_ff == 0) config_.d_ff = 4 * config_.d_model;
  const std::int64_t d = config_.d_model, ff = config_.d_ff, v = config_.vocab_size;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(config_.seed);
  const double proj_std = 0.02 / std::sqrt(2.0 * config_.layers);
  auto normal = [&](std::vector<std::int64_t> shape, double std) { return at::randn(shape, gen).mul_(std); };
  params_.emplace_back("tok_emb", normal({v, d}, 0.02));
  params_.emplace_back("pos_emb", normal({config_.context, d}, 0.02));
  for (int l = 0; l < config_.layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    const at::Tensor fields[kFields] = {at::ones({d}), at::zeros({d}), normal({3 * d, d}, 0.02), at::zeros({3 * d}),
                                        normal({d, d}, proj_std), at::zeros({d}), at::ones({d}), at::zeros({d}),
                                        normal({ff, d}, 0.02), at::zeros({ff}), normal({d, ff}, proj_std), at::zeros({d})};
    for (std::size_t f = 0; f < kFields; ++f) params_.emplace_back(p + kFieldNames[f], fields[f]);
  }
  params_.emplace_back("lnf.weight", at::ones({d}));
  params_.emplace_back("lnf.bias", at::zeros({d}));
  params_.emplace_back("head.weight", normal({v, d}, 0.02));
  add_scalar_heads(d, gen);
}

std::unique_ptr<DecodeCache> Policy::make_cache(std::int64_t batch, std::int64_t max_len) const {
  return std::make_unique<KvCache>(config_, batch, max_len);
}

std::size_t Policy::lm_head() const { return kFirstBlock + std::size_t(config_.layers) * kFields + 2; }

at::Tensor Policy::block(const at::Tensor& x, std::size_t layer, const at::Tensor& key_mask, KvCache* cache,
                         std::int64_t offset) const {
  const std::size_t base = kFirstBlock + layer * kFields;
  const std::int64_t b = x.size(0), tq = x.size(1), d = config_.d_model, h = config_.heads, dh = d / h;
  auto ln1 = at::layer_norm(x, {d}, param(base + kLn1W), param(base + kLn1B));
  auto qkv = at::linear(ln1, param(base + kQkvW), param(base + kQkvB)).view({b, tq, 3, h, dh}).permute({2, 0, 3, 1, 4});
  at::Tensor q = qkv[0], k = qkv[1], v = qkv[2];   // [B, H, Tq, Dh]
  if (cache != nullptr) {
    cache->keys(layer).narrow(2, offset, tq).copy_(k);
    cache->values(layer).narrow(2, offset, tq).copy_(v);
    k = cache->keys(layer).narrow(2, 0, offset + tq);
    v = cache->values(layer).narrow(2, 0, offset + tq);
  }
  auto y = FusedAttention::apply(q, k, v, key_mask, 1.0 / std::sqrt(double(dh))).transpose(1, 2).reshape({b, tq, d});
  auto h1 = x + at::linear(y, param(base + kOutW), param(base + kOutB));
  auto ln2 = at::layer_norm(h1, {d}, param(base + kLn2W), param(base + kLn2B));
  auto mlp = at::linear(at::gelu(at::linear(ln2, param(base + kFcW), param(base + kFcB))), param(base + kProjW),
                        param(base + kProjB));
  return h1 + mlp;
}

at::Tensor Policy::hidden(const at::Tensor& tokens, const at::Tensor& positions, const at::Tensor& key_mask,
                          KvCache* cache, std::int64_t offset) const {
  const std::int64_t tq = tokens.size(1), tk = offset + tq;
  if (cache == nullptr && offset != 0) throw std::invalid_argument("Policy::forward: offset without a cache");
  if (tk > config_.context || (cache != nullptr && tk > cache->max_len()))
    throw std::invalid_argument("Policy::forward: " + std::to_string(tk) + " positions exceed the context");
  if (key_mask.dim() != 2 || key_mask.size(0) != tokens.size(0) || key_mask.size(1) != tk)
    throw std::invalid_argument("Policy::forward: key_mask must be [B, offset + Tq]");
  // Query i (position offset + i) attends key j when key_mask[b, j] and j <= offset + i, and always itself.
  const auto mask = key_mask.to(at::kByte).contiguous();
  auto x = at::embedding(param(kTokEmb), tokens) + at::embedding(param(kPosEmb), positions);
  for (std::size_t l = 0; l < std::size_t(config_.layers); ++l) x = block(x, l, mask, cache, offset);
  const std::size_t tail = kFirstBlock + std::size_t(config_.layers) * kFields;
  return at::layer_norm(x, {config_.d_model}, param(tail), param(tail + 1));
}

at::Tensor Policy::forward(const at::Tensor& tokens, const at::Tensor& positions, const at::Tensor& key_mask,
                           DecodeCache* cache, std::int64_t offset) const {
  auto* kv = dynamic_cast<KvCache*>(cache);
  if (cache != nullptr && kv == nullptr) throw std::invalid_argument("Policy::forward: a cache another model made");
  return at::linear(hidden(tokens, positions, key_mask, kv, offset), param(lm_head()));
}

Policy::Outputs Policy::forward_outputs(const at::Tensor& tokens, const at::Tensor& positions, const at::Tensor& key_mask,
                                        bool logits) const {
  Outputs out;
  auto h = hidden(tokens, positions, key_mask, nullptr, 0);
  if (logits) out.logits = at::linear(h, param(lm_head()));
  out.heads = scalar_heads_of(h);
  return out;
}

at::Tensor positions_from_mask(const at::Tensor& attn_mask) {
  return at::cumsum(attn_mask.to(at::kLong), 1).sub_(1).clamp_min_(0);
}

namespace {

// Fused log-softmax + gather (+ entropy) of contiguous f32 logits [rows, V] via troupe::kernels.
void kernel_logprobs(const at::Tensor& logits, const at::Tensor& targets, float temperature, at::Tensor& logp,
                     at::Tensor* entropy) {
  const std::int64_t rows = logits.size(0), vocab = logits.size(1);
  logp = at::empty({rows}, at::kFloat);
  if (entropy != nullptr) *entropy = at::empty({rows}, at::kFloat);
  kernels::LogprobOptions opts;
  opts.temperature = temperature;
  auto st = kernels::logprob_gather(logits.data_ptr<float>(), rows, vocab, targets.data_ptr<std::int64_t>(),
                                    logp.data_ptr<float>(), entropy ? entropy->data_ptr<float>() : nullptr, opts);
  if (!st.ok()) throw ErrorException(Error{st.error().code, "logprob_gather: " + st.error().message});
}

}  // namespace

at::Tensor token_logprobs(const Model& model, const at::Tensor& tokens, const at::Tensor& attn_mask,
                          float temperature, at::Tensor* entropy) {
  return token_logprobs_of(model.forward(tokens, positions_from_mask(attn_mask), attn_mask), tokens, temperature, entropy);
}

at::Tensor token_values_of(const at::Tensor& head) {
  const std::int64_t n = head.size(0), t = head.size(1);
  return at::cat({at::zeros({n, 1}, head.options()), head.narrow(1, 0, t - 1)}, 1);
}

at::Tensor last_token_index(const at::Tensor& attn_mask) {
  const auto cols = at::arange(attn_mask.size(1), at::kLong).view({1, -1});
  return cols.mul(attn_mask.to(at::kLong)).amax(1);
}

at::Tensor token_logprobs_of(const at::Tensor& logits, const at::Tensor& tokens, float temperature, at::Tensor* entropy) {
  const std::int64_t n = tokens.size(0), t = tokens.size(1);
  // Row (n, t) predicts tokens[n, t + 1]; the last column predicts nothing (target 0, dropped).
  auto targets = at::cat({tokens.narrow(1, 1, t - 1), at::zeros({n, 1}, at::kLong)}, 1).contiguous();
  at::Tensor lp, ent;
  auto flat = logits.reshape({n * t, -1});
  if (at::GradMode::is_enabled() && logits.requires_grad()) {
    lp = at::log_softmax(flat.div(temperature), -1).gather(1, targets.view({-1, 1})).view({n, t});
    if (entropy != nullptr) {
      at::Tensor unused;
      kernel_logprobs(flat.detach().contiguous(), targets.view({-1}), temperature, unused, &ent);
    }
  } else {
    kernel_logprobs(flat.contiguous(), targets.view({-1}), temperature, lp, entropy ? &ent : nullptr);
    lp = lp.view({n, t});
  }
  auto zero = at::zeros({n, 1}, at::kFloat);
  if (entropy != nullptr) *entropy = at::cat({zero, ent.view({n, t}).narrow(1, 0, t - 1)}, 1);
  return at::cat({zero, lp.narrow(1, 0, t - 1)}, 1);
}

void set_compute_threads(int n, int blas_threads) {
  at::set_num_threads(n < 1 ? 1 : n);
  kernels::set_num_threads(n);
  if (blas_threads > 0) set_blas_threads(blas_threads);
}

// Through libgomp itself (blas.hpp): at::set_num_threads would also change process-wide settings,
// the count new threads start with and libtorch's pthreadpool.
ComputeScope::ComputeScope(int threads) {
  if (c10::InferenceMode::is_enabled()) no_inference_.emplace(false);
  (void)at::get_num_threads();   // libtorch sets a thread's count at its first op: first, not under this scope
  const int want = threads < 1 ? 1 : threads;
  const int before = openmp_threads();
  if (before == 0 || before == want) return;
  set_openmp_threads(want);
  threads_before_ = before;
}

ComputeScope::~ComputeScope() {
  if (threads_before_ > 0) set_openmp_threads(threads_before_);
}

}  // namespace troupe::actors
