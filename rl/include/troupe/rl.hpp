// troupe/rl.hpp: what an RL program needs besides troupe/troupe.hpp. Torch-free.
//
//   auto rt = troupe::init(argc, argv);
//   troupe::rl::Run run(rt, troupe::rl::RunConfig::demo());   // GRPO; algo.name picks another
//   troupe::rl::RunSummary s = run.run();
#pragma once

#include "troupe/actors/reference.hpp"
#include "troupe/actors/reward.hpp"
#include "troupe/actors/reward_model.hpp"
#include "troupe/actors/rollout_engine.hpp"
#include "troupe/actors/tokenizer.hpp"
#include "troupe/actors/trainer.hpp"
#include "troupe/rl/advantages.hpp"
#include "troupe/rl/algorithms.hpp"
#include "troupe/rl/batches.hpp"
#include "troupe/rl/checkpoint.hpp"
#include "troupe/rl/config.hpp"
#include "troupe/rl/kl_controller.hpp"
#include "troupe/rl/metrics.hpp"
#include "troupe/rl/reward.hpp"
#include "troupe/rl/rollouts.hpp"
#include "troupe/rl/run.hpp"
#include "troupe/rl/task.hpp"
#include "troupe/troupe.hpp"
