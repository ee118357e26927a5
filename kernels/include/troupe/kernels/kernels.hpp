#pragma once
// The whole kernels/ API: CPU twins in troupe::kernels, CUDA versions in troupe::kernels::cuda.
#include "troupe/kernels/advantage.hpp"
#include "troupe/kernels/attention.hpp"
#include "troupe/kernels/bucket.hpp"
#include "troupe/kernels/cuda.hpp"
#include "troupe/kernels/gae.hpp"
#include "troupe/kernels/kl.hpp"
#include "troupe/kernels/logprob.hpp"
#include "troupe/kernels/policy_loss.hpp"
#include "troupe/kernels/types.hpp"
