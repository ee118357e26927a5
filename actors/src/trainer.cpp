#include "troupe/actors/trainer.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <filesystem>
#include <stdexcept>

#include "troupe/actors/objective.hpp"
#include "troupe/actors/optimizer.hpp"
#include "troupe/actors/policy.hpp"
#include "troupe/actors/safetensors.hpp"
#include "troupe/actors/tensor_bridge.hpp"

namespace troupe::actors {

struct Trainer::Impl {
  TrainerConfig config;
  std::unique_ptr<Model> policy;   // the model it trains: a policy, a critic, a reward model
  AdamW optimizer;
  std::int64_t version = 0;
  // This trainer's last publish: the store's id and the store version it wrote there. The next
  // publish to that store, of a newer version, needs no look at the store's latest first.
  std::uint64_t published_store = 0, published_version = 0;
  explicit Impl(TrainerConfig c) : config(std::move(c)), policy(init(config.policy)), optimizer(policy->parameters(), config.optim) {}
  static std::unique_ptr<Model> init(const PolicyConfig& pc) {
    auto m = make_model(pc);
    m->set_requires_grad(true);
    return m;
  }
};

namespace {

struct Accumulated {
  double loss = 0, entropy_sum = 0;
  std::int64_t tokens = 0;
  std::map<std::string, double> metrics;
};

std::string shape_of(const at::Tensor& t) {
  std::string s = "[";
  for (std::int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "]";
}

// A batch's tensors against its tokens [N, T]: the masks [N, T], every input's first dimension N.
// Objectives and their kernels read them by the tokens' shape (a mask one column short would be
// read past its end).
void check_batch(const char* what, const at::Tensor& tokens, const at::Tensor& attn, const at::Tensor* loss_mask,
                 const std::map<std::string, at::Tensor>& inputs) {
  if (tokens.dim() != 2) throw std::invalid_argument(std::string(what) + ": tokens must be [N, T], not " + shape_of(tokens));
  const auto same = [&](const at::Tensor& t, const char* name) {
    if (t.sizes() != tokens.sizes())
      throw std::invalid_argument(std::string(what) + ": " + name + " is " + shape_of(t) + ", the tokens " + shape_of(tokens));
  };
  same(attn, "attn_mask");
  if (loss_mask != nullptr) same(*loss_mask, "loss_mask");
  for (const auto& [k, t] : inputs) {
    if (t.dim() < 1 || t.size(0) != tokens.size(0))
      throw std::invalid_argument(std::string(what) + ": input '" + k + "' is " + shape_of(t) + ", not " +
                                  std::to_string(tokens.size(0)) + " rows");
  }
}

// Rows [begin, begin + n) of every batch tensor.
ObjectiveInput slice_input(const TrainBatch& b, const std::map<std::string, at::Tensor>& inputs, std::int64_t begin,
                           std::int64_t n) {
  ObjectiveInput in;
  in.loss_mask = from_view(b.loss_mask).narrow(0, begin, n);
  in.attn_mask = from_view(b.attn_mask).narrow(0, begin, n);
  for (auto& [k, t] : inputs) in.inputs[k] = t.narrow(0, begin, n);
  in.options = b.options;
  return in;
}

}  // namespace

Trainer::Trainer(TrainerConfig config) {
  set_compute_threads(config.threads, config.blas_threads);
  impl_ = std::make_unique<Impl>(std::move(config));
}
Trainer::~Trainer() = default;
Trainer::Trainer(Trainer&&) noexcept = default;

TrainMetrics Trainer::train_step(TrainBatch batch) {
  const ComputeScope scope(impl_->config.threads);
  const auto start = std::chrono::steady_clock::now();
  const Objective objective = find_objective(batch.objective);
  const auto tokens = from_view(batch.tokens), attn = from_view(batch.attn_mask);
  std::map<std::string, at::Tensor> inputs;
  for (auto& [k, v] : batch.inputs) inputs[k] = from_view(v);
  const auto loss_mask = from_view(batch.loss_mask);
  check_batch("train_step", tokens, attn, &loss_mask, inputs);
  const std::int64_t n = tokens.size(0);
  const std::int64_t group = std::max<std::int64_t>(1, batch.row_group);
  if (n % group != 0) {
    throw std::invalid_argument("train_step: " + std::to_string(n) + " rows are not whole groups of " + std::to_string(group));
  }
  if (batch.loss_rows != 0 && batch.loss_rows < n) {
    throw std::invalid_argument("train_step: loss_rows " + std::to_string(batch.loss_rows) + " is fewer than the batch's " +
                                std::to_string(n) + " rows");
  }
  const double loss_rows = double(batch.loss_rows > 0 ? batch.loss_rows : n);
  const std::int64_t groups = n / group;
  const std::int64_t parts = std::clamp<std::int64_t>(batch.micro_batches, 1, std::max<std::int64_t>(1, groups));
  const std::int64_t chunk = (groups + parts - 1) / parts * group;   // whole groups in every part
  Accumulated acc;
  impl_->optimizer.zero_grad();
  for (std::int64_t begin = 0; begin < n; begin += chunk) {
    const std::int64_t rows = std::min(chunk, n - begin);
    const double weight = double(rows) / loss_rows;
    ObjectiveInput in = slice_input(batch, inputs, begin, rows);
    at::Tensor entropy;
    const auto part = tokens.narrow(0, begin, rows), part_attn = attn.narrow(0, begin, rows);
    auto outputs = impl_->policy->forward_outputs(part, positions_from_mask(part_attn), part_attn);   // logits and heads, one pass
    in.logp = token_logprobs_of(outputs.logits, part, batch.temperature, &entropy);
    in.heads = std::move(outputs.heads);
    ObjectiveOutput out = objective(in);
    out.loss.mul(weight).backward();
    acc.loss += weight * out.loss.item<double>();
    for (auto& [k, v] : out.metrics) acc.metrics[k] += weight * v;
    acc.entropy_sum += entropy.masked_select(in.loss_mask).sum().item<double>();
    acc.tokens += in.loss_mask.sum().item<std::int64_t>();
  }
  TrainMetrics m;
  m.grad_norm = impl_->optimizer.clip_gradients();
  m.lr = impl_->optimizer.step();
  m.policy_version = ++impl_->version;
  m.loss = acc.loss;
  m.values = std::move(acc.metrics);
  m.tokens = acc.tokens;
  m.entropy = acc.tokens > 0 ? acc.entropy_sum / double(acc.tokens) : 0.0;
  m.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return m;
}

Weights Trainer::weights() {
  Weights w;
  w.version = impl_->version;
  for (auto& [name, p] : impl_->policy->parameters()) {
    w.names.push_back(name);
    w.tensors.push_back(to_owned_view(p));
  }
  return w;
}

void Trainer::set_optimizer(OptimConfig config) {
  impl_->config.optim = config;
  impl_->optimizer = AdamW(impl_->policy->parameters(), config);
}

std::int64_t Trainer::publish_to(ActorRef<WeightStore> store) {
  const auto v = std::uint64_t(impl_->version + kStoreVersionOffset);
  const bool newer = store.id() == impl_->published_store && v > impl_->published_version;
  // A first publish there, the same version again (the store may have been cleared since) or an
  // older one (a checkpoint loaded): look.
  if (!newer) {
    const auto latest = store.call_sync(&WeightStore::latest_version);
    if (latest == v) return impl_->version;   // already there
    if (latest > v) {   // the engine would keep newer weights
      throw std::invalid_argument("publish_to: the store holds version " + std::to_string(latest) +
                                  ", newer than this trainer's " + std::to_string(v) + "; use a fresh store");
    }
  }   // else a newer version than this trainer's last there: the store refuses it if another publisher went past it
  std::vector<NamedTensor> named;
  for (auto& [name, p] : impl_->policy->parameters()) named.push_back({name, to_view(p)});
  store.call_sync(&WeightStore::publish, v, std::move(named));   // copied before this returns
  impl_->published_store = store.id();
  impl_->published_version = v;
  return impl_->version;
}

std::int64_t Trainer::policy_version() { return impl_->version; }

// Both files carry the version, so that a policy and optimizer state of two saves are not loaded
// as one (each file is written whole, by rename, but not both at once).
void Trainer::save_checkpoint(std::string dir) {
  std::filesystem::create_directories(dir);
  const std::string version = std::to_string(impl_->version);
  write_safetensors(dir + "/policy.safetensors", impl_->policy->views(), {{"version", version}});
  auto optim_meta = impl_->optimizer.state_metadata();
  optim_meta["version"] = version;
  write_safetensors(dir + "/optimizer.safetensors", impl_->optimizer.state_views(), optim_meta);
}

namespace {

// A checkpoint file's "version": absent 0 (weights saved without one), else a whole number >= 0.
std::int64_t version_of(const SafetensorsFile& file, const std::string& path) {
  auto it = file.metadata.find("version");
  if (it == file.metadata.end()) return 0;
  std::int64_t v = -1;
  const std::string& text = it->second;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || v < 0)
    throw std::invalid_argument(path + ": 'version' is '" + text + "', not a whole number >= 0");
  return v;
}

}  // namespace

// Everything checked before anything changes: a checkpoint that does not fit this trainer (another
// model's shapes, a torn or mixed pair of files) leaves its weights, moments and version as they were.
std::int64_t Trainer::load_checkpoint(std::string dir) {
  const std::string policy_path = dir + "/policy.safetensors", optim_path = dir + "/optimizer.safetensors";
  auto policy = read_safetensors(policy_path);
  auto optim = read_safetensors(optim_path);
  const std::int64_t version = version_of(policy, policy_path);
  if (optim.metadata.count("version") != 0 && version_of(optim, optim_path) != version) {
    throw std::invalid_argument(dir + ": policy.safetensors is version " + std::to_string(version) +
                                ", optimizer.safetensors version " + optim.metadata.at("version") + ": not one checkpoint");
  }
  impl_->policy->check(policy.tensors);
  impl_->optimizer.check_state(optim);
  impl_->policy->load(policy.tensors);
  impl_->optimizer.load_state(optim);
  impl_->version = version;
  return impl_->version;
}

void Trainer::save_weights(std::string path) { write_safetensors(path, impl_->policy->views()); }

TensorView Trainer::head_values(SequenceBatch batch, std::string head) {
  const ComputeScope scope(impl_->config.threads);
  at::NoGradGuard no_grad;
  const auto tokens = from_view(batch.tokens), attn = from_view(batch.attn_mask);
  check_batch("head_values", tokens, attn, nullptr, {});
  auto out = impl_->policy->forward_outputs(tokens, positions_from_mask(attn), attn, /*logits=*/false);
  auto it = out.heads.find(head);
  if (it == out.heads.end()) throw std::invalid_argument("head_values: the model has no '" + head + "' head");
  return to_view(token_values_of(it->second).contiguous());
}

std::vector<std::string> Trainer::load_trunk_as(std::string path, std::string file_head, std::string head) {
  auto file = read_safetensors(path);
  if (!file_head.empty()) {   // the file must have that head; it becomes this model's `head`
    const std::string from = file_head + "_head.", to = head + "_head.";
    if (from != to)   // the file's own `head`, if it has one, is not the one asked for
      std::erase_if(file.tensors, [&](const auto& t) { return t.first.rfind(to, 0) == 0; });
    bool found = false;
    for (auto& [name, t] : file.tensors) {
      if (name.rfind(from, 0) != 0) continue;
      name = to + name.substr(from.size());
      found = true;
    }
    if (!found) throw std::invalid_argument("load_trunk_as: " + path + " has no '" + file_head + "' head");
  }
  auto kept = impl_->policy->load_trunk(file.tensors);
  impl_->optimizer = AdamW(impl_->policy->parameters(), impl_->config.optim);   // fresh moments for the new weights
  return kept;
}

std::vector<std::string> Trainer::load_trunk(std::string path) { return load_trunk_as(std::move(path), "", ""); }

}  // namespace troupe::actors
