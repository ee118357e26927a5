#pragma once
// CUDA versions of the kernels. Same math and contracts as the CPU twins in the sibling headers,
// but every pointer (inputs, outputs, scalar outputs such as `loss`) is device memory, and the work
// is enqueued on `stream` (nullptr = the legacy default stream): the call returns after the launch.
// These functions always exist; without a CUDA build, or without a usable device, they return
// kUnavailable and touch nothing, so callers can fall back to the CPU twin. Launch errors come
// back as kDeviceError; errors inside a kernel surface at the next synchronisation, as in CUDA.
// Device results match the CPU twins within each kernel's stated tolerance (fast exp on device);
// pack_bucket is byte-identical for bf16/f32 and within one int8 step for kInt8Row.

#include <cstdint>
#include <span>

#include "troupe/kernels/advantage.hpp"
#include "troupe/kernels/bucket.hpp"
#include "troupe/kernels/gae.hpp"
#include "troupe/kernels/kl.hpp"
#include "troupe/kernels/logprob.hpp"
#include "troupe/kernels/policy_loss.hpp"
#include "troupe/kernels/types.hpp"

namespace troupe::kernels::cuda {

// Why cuda_available() is false (ok when it is true).
Status device_status();

Status logprob_gather(const float* logits, std::int64_t rows, std::int64_t vocab,
                      const std::int64_t* tokens, float* logprob, float* entropy = nullptr,
                      const LogprobOptions& options = {}, Stream stream = nullptr);
Status logprob_gather(const bf16* logits, std::int64_t rows, std::int64_t vocab,
                      const std::int64_t* tokens, float* logprob, float* entropy = nullptr,
                      const LogprobOptions& options = {}, Stream stream = nullptr);

Status group_advantages(const float* scores, std::int64_t groups, std::int64_t group_size,
                        float* advantages, float* group_mean = nullptr,
                        float* group_std = nullptr, const AdvantageOptions& options = {},
                        Stream stream = nullptr);

Status kl_penalty(const float* logp, const float* ref_logp, const std::uint8_t* mask,
                  std::int64_t n, float* kl, const KlOptions& options = {},
                  Stream stream = nullptr);

// One thread per row scans its tokens back to front (the recursion is sequential along a row).
Status gae(const float* rewards, const float* values, const std::uint8_t* mask, std::int64_t rows,
           std::int64_t tokens, float* advantages, float* returns, const GaeOptions& options = {},
           Stream stream = nullptr);

// Uses a small stream-ordered scratch allocation (cudaMallocAsync) of O(rows) bytes.
Status policy_loss(const float* logp, const float* old_logp, const float* advantages,
                   const std::uint8_t* mask, std::int64_t rows, std::int64_t tokens, float* loss,
                   float* grad_logp, float* clip_fraction = nullptr,
                   const PolicyLossOptions& options = {}, Stream stream = nullptr);

// One launch for the whole bucket; the entry table travels to the device with the launch.
Status pack_bucket(const BucketLayout& layout, std::span<const void* const> tensors,
                   std::byte* bucket, Stream stream = nullptr);
Status unpack_bucket(const BucketLayout& layout, const std::byte* bucket,
                     std::span<void* const> tensors, Stream stream = nullptr);

}  // namespace troupe::kernels::cuda
