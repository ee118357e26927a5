#include "troupe/kernels/cuda.hpp"

#include <doctest/doctest.h>

#include "reference.hpp"
#include "support/skip.hpp"

namespace tk = troupe::kernels;

// The device itself is checked by bench/device/kernels.sh; here only the no-device contract.
TEST_CASE("without a usable CUDA device the CUDA entry points say so and touch nothing") {
  if (tk::cuda_available()) TROUPE_SKIP("a CUDA device is usable here; bench/device/kernels.sh checks the kernels on it");
  CHECK(tk::cuda::device_status().error().code == tk::KernelCode::Unavailable);
  CHECK(!tk::cuda::device_status().error().message.empty());
  float out = troupe::kernels::testing::kNaN;
  const float x = 0.0f;
  const std::int64_t tok = 0;
  CHECK(tk::cuda::logprob_gather(&x, 1, 1, &tok, &out).error().code == tk::KernelCode::Unavailable);
  CHECK(tk::cuda::group_advantages(&x, 1, 1, &out).error().code == tk::KernelCode::Unavailable);
  CHECK(tk::cuda::kl_penalty(&x, &x, nullptr, 1, &out).error().code == tk::KernelCode::Unavailable);
  float ret = troupe::kernels::testing::kNaN;
  CHECK(tk::cuda::gae(&x, &x, nullptr, 1, 1, &out, &ret).error().code == tk::KernelCode::Unavailable);
  CHECK(std::isnan(ret));
  float loss = 0.0f;
  CHECK(tk::cuda::policy_loss(&x, &x, &x, nullptr, 1, 1, &loss, &out).error().code == tk::KernelCode::Unavailable);
  CHECK(std::isnan(out));
}
