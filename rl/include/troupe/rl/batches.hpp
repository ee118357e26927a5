// Glue between tasks and the actors' messages: prompts to token ids, problems to SFT batches,
// rollouts to reward requests. Torch-free: tensors are built as TensorViews directly.
#pragma once

#include <cstdint>
#include <vector>

#include "troupe/actors/tokenizer.hpp"
#include "troupe/actors/types.hpp"
#include "troupe/rl/task.hpp"

namespace troupe::rl {

std::vector<std::vector<std::int32_t>> encode_prompts(const std::vector<Problem>& problems,
                                                      const actors::Tokenizer& tokenizer);

// Teacher forcing on prompt + answer + eos (left-padded, as rollouts are); loss on answer and eos.
actors::TrainBatch sft_batch(const std::vector<Problem>& problems, const actors::Tokenizer& tokenizer);

// One ScoreItem per rollout row; row r answers problems[r / group_size].
std::vector<actors::ScoreItem> score_items(const std::vector<Problem>& problems, std::int32_t group_size,
                                           const actors::RolloutBatch& rollout, const actors::Tokenizer& tokenizer);

// A [n] f32 tensor owning a copy of `values`.
TensorView vector_view(const std::vector<float>& values);

// DPO's pairs from a policy's own samples (Rafailov et al. 2023, sec. 5: on-policy preference
// data): per prompt (rows g*G .. g*G+G-1), its first correct sample is chosen and its first
// incorrect one with a valid format rejected (so a pair never teaches the answer's shape alone; an
// invalid one stands in when none is valid); a prompt without both gives no pair. The row indices,
// chosen then rejected, pair after pair. Throws std::invalid_argument unless rewards.size() is a
// multiple of group_size.
std::vector<std::int64_t> preference_pairs(const std::vector<actors::RewardResult>& rewards, std::int32_t group_size);

// The Trainer's batch for one DPO step over `pairs` (preference_pairs' rows of `rollout`): those
// rows in pair order, the loss on the response, objective "dpo" with beta (and ipo), row_group 2 so
// that no micro-batch splits a pair. Its input ref_seq_logp is add_reference_logprobs' once the
// reference has scored the batch's rows: only those, a quarter of a step's samples at most (group 8).
actors::TrainBatch dpo_batch(const actors::RolloutBatch& rollout, const std::vector<std::int64_t>& pairs, double beta, bool ipo,
                             std::int32_t micro_batches = 1);

// Sets `batch`'s input ref_seq_logp [R]: each row's sum, over its loss mask, of the reference's
// per-token logprobs `ref_logp` [R, T] of the batch's own rows. Throws std::invalid_argument unless
// ref_logp is f32 and shaped like the loss mask.
void add_reference_logprobs(actors::TrainBatch& batch, const TensorView& ref_logp);

// Rows [begin, begin + n) of a batch: every [N, ...] tensor (tokens, masks, inputs) copied.
actors::TrainBatch rows_of(const actors::TrainBatch& batch, std::int64_t begin, std::int64_t n);
// Rows `rows` of a batch, in that order (each in range; a row may repeat), copied as rows_of does.
actors::TrainBatch select_rows(const actors::TrainBatch& batch, const std::vector<std::int64_t>& rows);

// A preference pair for a reward model: the prompt, a chosen answer and a rejected one.
struct PreferencePair {
  Problem problem;
  std::string chosen, rejected;
};

// Reward-model pairs from a policy's samples of `problems` (rows g*G .. g*G+G-1 answer problem g):
// chosen = the problem's correct answer, rejected = one of its samples that is wrong with a valid
// format (so both answers have the task's format), up to `per_problem` distinct ones, in sample
// order; a problem without one gives no pair.
std::vector<PreferencePair> reward_model_pairs(const std::vector<Problem>& problems, std::int32_t group_size,
                                               const actors::RolloutBatch& samples,
                                               const std::vector<actors::RewardResult>& rewards,
                                               const actors::Tokenizer& tokenizer, std::int32_t per_problem = 1);

// The Trainer's batch of `pairs` for objective "bradley_terry": rows chosen, rejected, pair after
// pair (prompt + answer + eos, sft_batch's layout), row_group 2, option margin.
actors::TrainBatch reward_model_batch(const std::vector<PreferencePair>& pairs, const actors::Tokenizer& tokenizer,
                                      double margin = 0.0, std::int32_t micro_batches = 1);

}  // namespace troupe::rl
