#pragma once
// Kernel 7: attention over short sequences, fused. Per (batch row, head) the scores, their masked
// softmax and the weighted sum of the values are one pass over a [Tq x Tk] tile, and the backward
// pass is another. At the demo's sizes (T ~ 10, head width 16, 1,000+ tiles a batch) batched GEMMs
// over [T x D] tiles and a softmax along a 10-wide axis spend most of their time outside the
// arithmetic: for 300 rows of 10 tokens, 4 heads of width 16, ATen's matmul + masked softmax +
// matmul with its backward takes 11.5 ms and this kernel 3.1 ms (build/bench/kernels, `attention`,
// 2 threads); the demo's train phase went 52 -> 36 ms a step with it (README).
// CPU only: on a GPU, a model would use the vendor's fused attention.

#include <cstdint>

#include "troupe/kernels/types.hpp"

namespace troupe::kernels {

struct AttentionShape {
  std::int64_t batch = 0, heads = 0;
  std::int64_t queries = 0;   // Tq
  std::int64_t keys = 0;      // Tk = offset + Tq: the queries are the last Tq positions
  std::int64_t dim = 0;       // D, the head width
  // Rows each (batch, head) tile holds in k and v, of which the first Tk are read; 0 means Tk. A
  // KV cache's first Tk positions are then read in place: k and v as [B, H, key_rows, D].
  std::int64_t key_rows = 0;
};

// q [B, H, Tq, D], k and v [B, H, key_rows, D] (key_rows >= Tk), all contiguous f32; key_mask [B, Tk] (nonzero: the key
// may be attended; nullptr: every key). Query i sits at position p = Tk - Tq + i and attends key j
// when (key_mask[b][j] and j <= p) or j == p (itself always, so a padding query stays finite):
//   probs[b,h,i,:] = softmax_j(scale * q_i . k_j over the allowed j; 0 elsewhere)
//   out[b,h,i,:]   = sum_j probs[b,h,i,j] * v_j
// probs [B, H, Tq, Tk] is written for the backward pass; out [B, H, Tq, D]. Accumulation in f32,
// the softmax's sum in f64. Multithreaded over (batch, head) tiles (see set_num_threads).
Status attention_forward(const float* q, const float* k, const float* v, const std::uint8_t* key_mask,
                         const AttentionShape& shape, float scale, float* probs, float* out);

// The gradients of sum(out * d_out) with respect to q, k and v, from the forward's probs:
//   dv_j = sum_i p_ij d_out_i;  dp_ij = d_out_i . v_j;  ds_ij = p_ij (dp_ij - sum_j' p_ij' dp_ij')
//   dq_i = scale sum_j ds_ij k_j;  dk_j = scale sum_i ds_ij q_i
// dq [B, H, Tq, D], dk and dv [B, H, Tk, D], every element written.
Status attention_backward(const float* q, const float* k, const float* v, const float* probs, const float* d_out,
                          const AttentionShape& shape, float scale, float* dq, float* dk, float* dv);

}  // namespace troupe::kernels
