// Small fixtures shared by the actors tests: a tiny policy and a batch the Trainer can learn.
#pragma once

#include <cstdint>

#include "troupe/actors/types.hpp"

namespace troupe::actors::testing {

inline PolicyConfig tiny_policy() {
  PolicyConfig c;
  c.vocab_size = 8;
  c.context = 12;
  c.layers = 1;
  c.d_model = 16;
  c.heads = 2;
  c.seed = 3;
  return c;
}

// Rows "1 2 3 4 5" (all real); loss on the last three tokens.
inline TrainBatch copy_batch(int rows) {
  TrainBatch b;
  b.objective = "sft";
  b.tokens = troupe::TensorView::empty(troupe::DType::I64, {rows, 5});
  b.attn_mask = troupe::TensorView::empty(troupe::DType::Bool, {rows, 5});
  b.loss_mask = troupe::TensorView::empty(troupe::DType::Bool, {rows, 5});
  for (int r = 0; r < rows; ++r) {
    for (int t = 0; t < 5; ++t) {
      b.tokens.data_as<std::int64_t>()[r * 5 + t] = 1 + (t + r) % 6;
      b.attn_mask.data_as<bool>()[r * 5 + t] = true;
      b.loss_mask.data_as<bool>()[r * 5 + t] = t >= 2;
    }
  }
  return b;
}

}  // namespace troupe::actors::testing
