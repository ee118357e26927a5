#include "troupe/kernels/cuda.hpp"

#include <doctest/doctest.h>

#include "reference.hpp"

namespace tk = troupe::kernels;

// The device itself is checked by bench/device/kernels.sh; here only the no-device contract.
TEST_CASE("without a usable CUDA device the CUDA entry points say so and touch nothing") {
  if (tk::cuda_available()) {
    MESSAGE("a CUDA device is usable; bench/device/kernels.sh checks the kernels on it");
    CHECK(tk::cuda::device_status().ok());
    return;
  }
  CHECK(tk::cuda::device_status().code() == tk::ErrorCode::kUnavailable);
  CHECK(!tk::cuda::device_status().message().empty());
  float out = troupe::kernels::testing::kNaN;
  const float x = 0.0f;
  const std::int64_t tok = 0;
  CHECK(tk::cuda::logprob_gather(&x, 1, 1, &tok, &out).code() == tk::ErrorCode::kUnavailable);
  CHECK(tk::cuda::group_advantages(&x, 1, 1, &out).code() == tk::ErrorCode::kUnavailable);
  CHECK(tk::cuda::kl_penalty(&x, &x, nullptr, 1, &out).code() == tk::ErrorCode::kUnavailable);
  float loss = 0.0f;
  CHECK(tk::cuda::policy_loss(&x, &x, &x, nullptr, 1, 1, &loss, &out).code() == tk::ErrorCode::kUnavailable);
  CHECK(std::isnan(out));
}
