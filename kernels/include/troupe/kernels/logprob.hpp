#pragma once
// Kernel 1: fused log-softmax + gather. Per row, one pass over the logits gives the logprob of the
// sampled token and (optionally) the entropy, without materialising the [rows x vocab] log-softmax.

#include <cstdint>

#include "troupe/kernels/types.hpp"

namespace troupe::kernels {

struct LogprobOptions {
  std::int64_t row_stride = 0;  // elements between consecutive rows' starts; 0 means `vocab`
  float temperature = 1.0f;     // logits are divided by it before the softmax; must be > 0
};

// Shapes: logits [rows x vocab] row-major with options.row_stride; tokens [rows] (int64, as torch
// indices are); logprob [rows]; entropy [rows] or nullptr.
//   logprob[r] = z[r][tokens[r]] - logsumexp(z[r]),  z = logits / temperature
//   entropy[r] = -sum_v p[r][v] log p[r][v],          p = softmax(z[r])
// Accumulation is fp32 per chunk and fp64 per row; against an fp64 reference on the same inputs,
// |error| <= 1e-5 * (1 + |reference|) for vocab up to 2^20 (tests check this).
// Edge cases: -inf logits have p = 0; a row of only -inf gives NaN for both outputs (as torch);
// a token outside [0, vocab) gives logprob NaN (entropy is still written); vocab 1 gives 0, 0.
// Every output element is written. Multithreaded over rows (see set_num_threads).
Status logprob_gather(const float* logits, std::int64_t rows, std::int64_t vocab,
                      const std::int64_t* tokens, float* logprob, float* entropy = nullptr,
                      const LogprobOptions& options = {});

// The same for bf16 logits (the values are widened exactly; math as above).
Status logprob_gather(const bf16* logits, std::int64_t rows, std::int64_t vocab,
                      const std::int64_t* tokens, float* logprob, float* entropy = nullptr,
                      const LogprobOptions& options = {});

}  // namespace troupe::kernels
