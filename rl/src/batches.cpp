#include "troupe/rl/batches.hpp"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <stdexcept>
#include <string>

namespace troupe::rl {

std::vector<std::vector<std::int32_t>> encode_prompts(const std::vector<Problem>& problems,
                                                      const actors::Tokenizer& tokenizer) {
  std::vector<std::vector<std::int32_t>> out;
  out.reserve(problems.size());
  for (auto& p : problems) out.push_back(tokenizer.encode(p.prompt));
  return out;
}

actors::TrainBatch sft_batch(const std::vector<Problem>& problems, const actors::Tokenizer& tokenizer) {
  std::vector<std::vector<std::int32_t>> prompts = encode_prompts(problems, tokenizer), answers;
  std::size_t p_len = 0, a_len = 0;
  for (std::size_t i = 0; i < problems.size(); ++i) {
    answers.push_back(tokenizer.encode(problems[i].answer));
    answers.back().push_back(tokenizer.eos_id());
    p_len = std::max(p_len, prompts[i].size());
    a_len = std::max(a_len, answers[i].size());
  }
  const auto n = std::int64_t(problems.size()), t = std::int64_t(p_len + a_len);
  actors::TrainBatch b;
  b.objective = "sft";
  b.tokens = TensorView::empty(DType::I64, {n, t});
  b.attn_mask = TensorView::empty(DType::Bool, {n, t});
  b.loss_mask = TensorView::empty(DType::Bool, {n, t});
  auto* tok = b.tokens.data_as<std::int64_t>();
  auto* attn = b.attn_mask.data_as<bool>();
  auto* loss = b.loss_mask.data_as<bool>();
  for (std::int64_t r = 0; r < n; ++r) {
    const auto& p = prompts[std::size_t(r)];
    const auto& a = answers[std::size_t(r)];
    const std::int64_t start = std::int64_t(p_len - p.size());
    for (std::size_t j = 0; j < p.size(); ++j) { tok[r * t + start + std::int64_t(j)] = p[j]; attn[r * t + start + std::int64_t(j)] = true; }
    for (std::size_t j = 0; j < a.size(); ++j) {
      const std::int64_t c = r * t + std::int64_t(p_len + j);
      tok[c] = a[j];
      attn[c] = loss[c] = true;
    }
  }
  return b;
}

std::vector<actors::ScoreItem> score_items(const std::vector<Problem>& problems, std::int32_t group_size,
                                           const actors::RolloutBatch& rollout, const actors::Tokenizer& tokenizer) {
  std::vector<actors::ScoreItem> items(rollout.responses.size());
  for (std::size_t r = 0; r < items.size(); ++r) {
    items[r].response = tokenizer.decode(rollout.responses[r]);
    items[r].ground_truth = problems[r / std::size_t(group_size)].answer;
    items[r].finished = rollout.finished[r] != 0;
  }
  return items;
}

TensorView vector_view(const std::vector<float>& values) {
  auto v = TensorView::empty(DType::F32, {std::int64_t(values.size())});
  if (!values.empty()) std::memcpy(v.data, values.data(), values.size() * sizeof(float));
  return v;
}

std::vector<std::int64_t> preference_pairs(const std::vector<actors::RewardResult>& rewards, std::int32_t group_size) {
  if (group_size < 1 || rewards.size() % std::size_t(group_size) != 0) {
    throw std::invalid_argument("preference_pairs: " + std::to_string(rewards.size()) + " samples in groups of " +
                                std::to_string(group_size));
  }
  std::vector<std::int64_t> pairs;
  const auto g = std::int64_t(group_size);
  for (std::int64_t first = 0; first < std::int64_t(rewards.size()); first += g) {
    std::int64_t chosen = -1, rejected = -1, rejected_invalid = -1;
    for (std::int64_t i = first; i < first + g; ++i) {
      const auto& r = rewards[std::size_t(i)];
      if (r.correct && chosen < 0) chosen = i;
      if (!r.correct && r.format_ok && rejected < 0) rejected = i;
      if (!r.correct && !r.format_ok && rejected_invalid < 0) rejected_invalid = i;
    }
    if (rejected < 0) rejected = rejected_invalid;
    if (chosen < 0 || rejected < 0) continue;
    pairs.push_back(chosen);
    pairs.push_back(rejected);
  }
  return pairs;
}

namespace {

// Rows `rows` of a [N, ...] tensor, in that order.
TensorView gather_rows(const TensorView& t, const std::vector<std::int64_t>& rows) {
  if (t.shape.empty() || !t.is_contiguous()) throw std::invalid_argument("dpo_batch: rollout tensors must be contiguous [N, ...]");
  std::vector<std::int64_t> shape = t.shape;
  const std::int64_t n = shape.at(0);
  shape[0] = std::int64_t(rows.size());
  auto out = TensorView::empty(t.dtype, shape);
  const std::size_t row_bytes = n > 0 ? t.nbytes() / std::size_t(n) : 0;
  for (std::size_t k = 0; k < rows.size(); ++k) {
    if (rows[k] < 0 || rows[k] >= n) throw std::invalid_argument("dpo_batch: row " + std::to_string(rows[k]) + " out of range");
    std::memcpy(static_cast<char*>(out.data) + k * row_bytes, static_cast<const char*>(t.data) + std::size_t(rows[k]) * row_bytes,
                row_bytes);
  }
  return out;
}

}  // namespace

actors::TrainBatch dpo_batch(const actors::RolloutBatch& rollout, const std::vector<std::int64_t>& pairs, double beta, bool ipo,
                             std::int32_t micro_batches) {
  if (pairs.size() % 2 != 0) throw std::invalid_argument("dpo_batch: pairs come as (chosen, rejected) rows");
  actors::TrainBatch b;
  b.objective = "dpo";
  b.tokens = gather_rows(rollout.tokens, pairs);
  b.attn_mask = gather_rows(rollout.attn_mask, pairs);
  b.loss_mask = gather_rows(rollout.response_mask, pairs);
  b.options = {{"beta", beta}, {"ipo", ipo ? 1.0 : 0.0}};
  b.micro_batches = micro_batches;
  b.row_group = 2;
  return b;
}

void add_reference_logprobs(actors::TrainBatch& batch, const TensorView& ref_logp) {
  const TensorView& mask = batch.loss_mask;
  if (ref_logp.dtype != DType::F32 || mask.dtype != DType::Bool || ref_logp.shape != mask.shape || mask.shape.size() != 2 ||
      !ref_logp.is_contiguous() || !mask.is_contiguous()) {
    throw std::invalid_argument("add_reference_logprobs: ref_logp must be f32 [R, T] like the batch's loss mask");
  }
  const std::int64_t rows = mask.shape[0], t = mask.shape[1];
  std::vector<float> ref_seq(static_cast<std::size_t>(rows));
  for (std::int64_t k = 0; k < rows; ++k) {
    double sum = 0;   // the response's log-likelihood under the reference
    for (std::int64_t j = k * t; j < (k + 1) * t; ++j) {
      if (mask.data_as<bool>()[j]) sum += ref_logp.data_as<float>()[j];
    }
    ref_seq[std::size_t(k)] = float(sum);
  }
  batch.inputs["ref_seq_logp"] = vector_view(ref_seq);
}

std::vector<PreferencePair> reward_model_pairs(const std::vector<Problem>& problems, std::int32_t group_size,
                                               const actors::RolloutBatch& samples,
                                               const std::vector<actors::RewardResult>& rewards,
                                               const actors::Tokenizer& tokenizer, std::int32_t per_problem) {
  if (group_size < 1 || rewards.size() != problems.size() * std::size_t(group_size) || samples.responses.size() != rewards.size())
    throw std::invalid_argument("reward_model_pairs: " + std::to_string(rewards.size()) + " scored samples for " +
                                std::to_string(problems.size()) + " problems of " + std::to_string(group_size));
  std::vector<PreferencePair> out;
  for (std::size_t g = 0; g < problems.size(); ++g) {
    std::vector<std::string> taken;
    for (std::size_t s = 0; s < std::size_t(group_size) && std::int32_t(taken.size()) < per_problem; ++s) {
      const std::size_t r = g * std::size_t(group_size) + s;
      if (rewards[r].correct || !rewards[r].format_ok) continue;
      std::string wrong = tokenizer.decode(samples.responses[r]);
      if (std::find(taken.begin(), taken.end(), wrong) != taken.end()) continue;
      out.push_back(PreferencePair{problems[g], problems[g].answer, wrong});
      taken.push_back(std::move(wrong));
    }
  }
  return out;
}

namespace {

// Rows `rows` of v, in that order, into a fresh contiguous tensor.
TensorView row_copy(const TensorView& v, const std::vector<std::int64_t>& rows, const char* who) {
  if (v.shape.empty() || !v.is_contiguous()) throw std::invalid_argument(std::string(who) + ": a tensor that is not contiguous");
  auto shape = v.shape;
  shape[0] = std::int64_t(rows.size());
  TensorView out = TensorView::empty(v.dtype, shape);
  const std::size_t row = v.shape[0] == 0 ? 0 : v.nbytes() / std::size_t(v.shape[0]);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] < 0 || rows[i] >= v.shape[0]) throw std::invalid_argument(std::string(who) + ": rows out of range");
    if (row > 0) std::memcpy(out.data_as<char>() + row * i, static_cast<const char*>(v.data) + row * std::size_t(rows[i]), row);
  }
  return out;
}

actors::TrainBatch copy_rows(const actors::TrainBatch& batch, const std::vector<std::int64_t>& rows, const char* who) {
  actors::TrainBatch b = batch;
  b.tokens = row_copy(batch.tokens, rows, who);
  b.attn_mask = row_copy(batch.attn_mask, rows, who);
  b.loss_mask = row_copy(batch.loss_mask, rows, who);
  for (auto& [k, v] : b.inputs) v = row_copy(batch.inputs.at(k), rows, who);
  return b;
}

}  // namespace

actors::TrainBatch rows_of(const actors::TrainBatch& batch, std::int64_t begin, std::int64_t n) {
  if (begin < 0 || n < 0) throw std::invalid_argument("rows_of: rows out of range");
  std::vector<std::int64_t> rows(static_cast<std::size_t>(n));
  std::iota(rows.begin(), rows.end(), begin);
  return copy_rows(batch, rows, "rows_of");
}

actors::TrainBatch select_rows(const actors::TrainBatch& batch, const std::vector<std::int64_t>& rows) {
  return copy_rows(batch, rows, "select_rows");
}

actors::TrainBatch reward_model_batch(const std::vector<PreferencePair>& pairs, const actors::Tokenizer& tokenizer,
                                      double margin, std::int32_t micro_batches) {
  std::vector<Problem> rows;
  rows.reserve(2 * pairs.size());
  for (const auto& p : pairs) {
    rows.push_back(Problem{p.problem.prompt, p.chosen});
    rows.push_back(Problem{p.problem.prompt, p.rejected});
  }
  actors::TrainBatch b = sft_batch(rows, tokenizer);
  b.objective = "bradley_terry";
  b.options = {{"margin", margin}};
  b.row_group = 2;
  b.micro_batches = micro_batches;
  return b;
}

}  // namespace troupe::rl
