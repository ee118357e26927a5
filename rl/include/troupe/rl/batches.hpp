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

}  // namespace troupe::rl
