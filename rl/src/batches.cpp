#include "troupe/rl/batches.hpp"

#include <algorithm>
#include <cstring>

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

}  // namespace troupe::rl
