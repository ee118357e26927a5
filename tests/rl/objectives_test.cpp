// GRPO's math against hand-computed values, and the kernel-routed gradients against autograd
// through the plain formulas.
#include <doctest/doctest.h>

#include <ATen/ATen.h>

#include "support/doctest_after_torch.hpp"   // ATen redefines CHECK

#include <cmath>

#include <unistd.h>

#include <algorithm>

#include "actors/fixtures.hpp"
#include "troupe/actors/trainer.hpp"
#include "troupe/rl/advantages.hpp"
#include "troupe/rl/algorithms.hpp"
#include "troupe/rl/objectives.hpp"

using namespace troupe::rl;

namespace {

// A program's own objective (GRPO's, marked), registered at static initialisation: it then exists
// in worker processes too. grpo_test.cpp trains with it in the trainer's worker process.
troupe::actors::ObjectiveOutput marked_grpo(const troupe::actors::ObjectiveInput& in) {
  auto out = grpo_objective(in);
  out.metrics["test_marker"] = 7.0;
  out.metrics["test_pid"] = double(::getpid());
  return out;
}
TROUPE_OBJECTIVE("test_marked_grpo", &marked_grpo);

at::Tensor t2(std::vector<float> v, std::int64_t rows) { return at::tensor(v).view({rows, -1}); }
at::Tensor mask2(std::vector<int> v, std::int64_t rows) { return at::tensor(v).view({rows, -1}).to(at::kBool); }

// The plain formulas, differentiated by autograd (the reference for the kernel path).
at::Tensor plain_seq_mean(const at::Tensor& x, const at::Tensor& m) {
  auto mf = m.to(at::kFloat);
  return ((x * mf).sum(1) / mf.sum(1)).mean();
}
at::Tensor plain_k3(const at::Tensor& logp, const at::Tensor& ref) { auto u = ref - logp; return u.exp() - u - 1; }
at::Tensor plain_pg(const at::Tensor& logp, const at::Tensor& old, const at::Tensor& adv, double eps) {
  auto ratio = (logp - old).exp();
  auto a = adv.view({-1, 1});
  return at::max(-a * ratio, -a * ratio.clamp(1 - eps, 1 + eps));
}

}  // namespace

TEST_CASE("group advantages match hand-computed values") {
  // Group 1: rewards 1, 0, 0, 1 -> mean 0.5, unbiased std sqrt(4 * 0.25 / 3) = 0.57735 -> +-0.866025.
  // Group 2: all equal -> 0. Group 3: 1, 0, 0, 0 -> mean .25, std 0.5 -> 1.5, -0.5, -0.5, -0.5.
  auto a = group_advantages({1, 0, 0, 1, 1, 1, 1, 1, 1, 0, 0, 0}, 4);
  const float expected[12] = {0.866025f, -0.866025f, -0.866025f, 0.866025f, 0, 0, 0, 0, 1.5f, -0.5f, -0.5f, -0.5f};
  for (int i = 0; i < 12; ++i) CHECK(a[i] == doctest::Approx(expected[i]).epsilon(1e-5));
  CHECK_THROWS_AS(group_advantages({1, 0, 1}, 2), std::invalid_argument);
}

TEST_CASE("k3 KL matches hand-computed values and its gradient") {
  // u = ref - logp: u = -1 -> e^-1 + 1 - 1 = 0.367879; u = 1 -> e - 2 = 0.718282; u = 0 -> 0.
  // d k3 / d logp = 1 - e^u: 0.632121, -1.718282, 0; the masked token has value and gradient 0.
  auto logp = t2({-1, -2, -0.5f, -3}, 1).requires_grad_(true);
  auto ref = t2({-2, -1, -0.5f, -1}, 1);
  auto mask = mask2({1, 1, 1, 0}, 1);
  auto kl = kl_k3(logp, ref, mask);
  CHECK(kl[0][0].item<float>() == doctest::Approx(0.367879).epsilon(1e-5));
  CHECK(kl[0][1].item<float>() == doctest::Approx(0.718282).epsilon(1e-5));
  CHECK(kl[0][2].item<float>() == doctest::Approx(0.0));
  CHECK(kl[0][3].item<float>() == 0.0f);
  kl.sum().backward();
  auto g = logp.grad();
  CHECK(g[0][0].item<float>() == doctest::Approx(0.632121).epsilon(1e-5));
  CHECK(g[0][1].item<float>() == doctest::Approx(-1.718282).epsilon(1e-5));
  CHECK(g[0][2].item<float>() == doctest::Approx(0.0));
  CHECK(g[0][3].item<float>() == 0.0f);
}

// Their kernels read every tensor by logp's shape: one of another shape is refused, not read past.
TEST_CASE("k3 KL and the clipped policy loss refuse tensors of another shape than logp's") {
  auto logp = t2({-1, -2, -0.5f, -3}, 2);
  auto mask = mask2({1, 1, 1, 0}, 2);
  auto short_ref = at::zeros({2, 1});
  auto short_mask = mask.narrow(1, 0, 1).contiguous();
  CHECK_THROWS_AS(kl_k3(logp, short_ref, mask), std::invalid_argument);
  CHECK_THROWS_AS(kl_k3(logp, logp, short_mask), std::invalid_argument);
  auto adv = at::tensor({1.0f, -1.0f});
  CHECK_THROWS_AS(clipped_policy_loss(logp, short_ref, adv, mask, 0.2), std::invalid_argument);
  CHECK_THROWS_AS(clipped_policy_loss(logp, logp, adv, short_mask, 0.2), std::invalid_argument);
  CHECK_NOTHROW(clipped_policy_loss(logp, logp, adv, mask, 0.2));
}

TEST_CASE("the clipped policy loss matches hand-computed values and gradients") {
  // Row 0, A = +1, tokens: ratio 1.5 (clipped to 1.2: l = -1.2, no gradient), ratio 0.9 (l = -0.9,
  //   unclipped: d l / d logp = -A r = -0.9).
  // Row 1, A = -1, one valid token: ratio 1.5 (l = max(1.5, 1.2) = 1.5, unclipped: gradient +1.5).
  // seq-mean-token-mean: row 0 = (-1.2 - 0.9) / 2 = -1.05, row 1 = 1.5 -> loss 0.225.
  // Weights: row 0 tokens 1/2 * 1/2 = 0.25, row 1 token 1/2 -> gradients -0.225, 0.75. Clipped share 1/3.
  auto old = t2({0, 0, 0, 0}, 2);
  auto logp = t2({std::log(1.5f), std::log(0.9f), std::log(1.5f), 0}, 2).requires_grad_(true);
  auto adv = at::tensor({1.0f, -1.0f});
  auto mask = mask2({1, 1, 1, 0}, 2);
  auto pl = clipped_policy_loss(logp, old, adv, mask, 0.2);
  CHECK(pl.loss.item<float>() == doctest::Approx(0.225).epsilon(1e-5));
  CHECK(pl.clip_fraction == doctest::Approx(1.0 / 3.0));
  pl.loss.backward();
  auto g = logp.grad();
  CHECK(g[0][0].item<float>() == doctest::Approx(0.0));
  CHECK(g[0][1].item<float>() == doctest::Approx(-0.225).epsilon(1e-5));
  CHECK(g[1][0].item<float>() == doctest::Approx(0.75).epsilon(1e-5));
  CHECK(g[1][1].item<float>() == 0.0f);
}

TEST_CASE("the GRPO objective equals pg + beta * kl, with gradients equal to autograd of the plain formulas") {
  at::manual_seed(3);
  const std::int64_t n = 6, t = 7;
  auto base = at::randn({n, t}) * 0.3 - 1.0;
  auto old = base + at::randn({n, t}) * 0.1;
  auto ref = base + at::randn({n, t}) * 0.2;
  auto adv = at::randn({n});
  auto mask = at::rand({n, t}) > 0.3;
  mask.select(1, 0).fill_(true);   // every row has a token
  troupe::actors::ObjectiveInput in;
  in.logp = base.clone().requires_grad_(true);
  in.loss_mask = mask;
  in.inputs = {{"old_logp", old}, {"ref_logp", ref}, {"advantages", adv}};
  in.options = {{"clip_eps", 0.2}, {"kl_coef", 0.1}};
  auto out = grpo_objective(in);
  out.loss.backward();

  auto logp = base.clone().requires_grad_(true);
  auto expected = plain_seq_mean(plain_pg(logp, old, adv, 0.2), mask) + 0.1 * plain_seq_mean(plain_k3(logp, ref), mask);
  expected.backward();
  CHECK(out.loss.item<double>() == doctest::Approx(expected.item<double>()).epsilon(1e-5));
  CHECK(out.metrics.at("kl") == doctest::Approx(plain_seq_mean(plain_k3(base, ref), mask).item<double>()).epsilon(1e-5));
  CHECK(at::allclose(in.logp.grad(), logp.grad(), 1e-5, 1e-6));
}

TEST_CASE("at ratio 1 the GRPO gradient is the advantage-weighted log-likelihood gradient") {
  // On-policy first update: old = logp, so d loss / d logp_t = -A_s / (n * |o_s|).
  auto logp = t2({-1, -2, -3, -1}, 2).requires_grad_(true);
  auto adv = at::tensor({2.0f, -1.0f});
  auto mask = mask2({1, 1, 1, 0}, 2);
  auto pl = clipped_policy_loss(logp, logp.detach(), adv, mask, 0.2);
  pl.loss.backward();
  CHECK(logp.grad()[0][0].item<float>() == doctest::Approx(-2.0 / (2 * 2)));
  CHECK(logp.grad()[1][0].item<float>() == doctest::Approx(1.0 / (2 * 1)));
  CHECK(pl.loss.item<float>() == doctest::Approx(-(2.0 - 1.0) / 2));
}

TEST_CASE("the GRPO objective without old_logp is on-policy: the same as old_logp = logp, detached") {
  at::manual_seed(4);
  auto base = at::randn({4, 5}) * 0.3 - 1.0;
  auto ref = base + at::randn({4, 5}) * 0.2;
  auto adv = at::randn({4});
  auto mask = at::rand({4, 5}) > 0.2;
  mask.select(1, 0).fill_(true);
  auto run = [&](bool with_old) {
    troupe::actors::ObjectiveInput in;
    in.logp = base.clone().requires_grad_(true);
    in.loss_mask = mask;
    in.inputs = {{"ref_logp", ref}, {"advantages", adv}};
    if (with_old) in.inputs["old_logp"] = base.clone();
    in.options = {{"clip_eps", 0.2}, {"kl_coef", 0.1}};
    auto out = grpo_objective(in);
    out.loss.backward();
    return std::make_pair(out.loss.item<double>(), in.logp.grad());
  };
  auto [loss_on, grad_on] = run(false);
  auto [loss_old, grad_old] = run(true);
  CHECK(loss_on == loss_old);
  CHECK(at::equal(grad_on, grad_old));
}

TEST_CASE("the GRPO objective with beta 0 needs no reference (the policy loss alone, no kl metric), with beta > 0 it does") {
  at::manual_seed(5);
  auto base = at::randn({3, 4}) * 0.3 - 1.0;
  auto adv = at::randn({3});
  auto mask = at::ones({3, 4}, at::kBool);
  troupe::actors::ObjectiveInput in;
  in.logp = base.clone().requires_grad_(true);
  in.loss_mask = mask;
  in.inputs = {{"advantages", adv}};
  in.options = {{"clip_eps", 0.2}, {"kl_coef", 0.0}};
  auto out = grpo_objective(in);
  CHECK(out.metrics.count("kl") == 0);
  CHECK(out.loss.item<double>() == doctest::Approx(clipped_policy_loss(base, base, adv, mask, 0.2).loss.item<double>()));
  in.options["kl_coef"] = 0.1;
  CHECK_THROWS_AS(grpo_objective(in), std::invalid_argument);
}

TEST_CASE("DPO and IPO losses and their gradients match hand-computed values") {
  // One pair. Chosen: logp -1, -2 (both valid) -> s = -3, ref -4; rejected: -2, (-2 masked) -> s = -2,
  // ref -1. h = (-3 + 4) - (-2 + 1) = 2.
  auto logp = t2({-1, -2, -2, -2}, 2).requires_grad_(true);
  auto mask = mask2({1, 1, 1, 0}, 2);
  auto ref = at::tensor({-4.0f, -1.0f});
  // DPO, beta 0.5: -log sigmoid(1) = log(1 + e^-1) = 0.313262; d/dh = -beta sigmoid(-1) = -0.134471,
  // so -0.134471 on each chosen token, +0.134471 on the rejected valid token, 0 off the mask.
  auto dpo = preference_loss(logp, mask, ref, 0.5, false);
  CHECK(dpo.loss.item<float>() == doctest::Approx(0.313262).epsilon(1e-5));
  CHECK(dpo.reward_accuracy == doctest::Approx(1.0));
  CHECK(dpo.reward_margin == doctest::Approx(1.0));
  dpo.loss.backward();
  auto g = logp.grad().clone();
  CHECK(g[0][0].item<float>() == doctest::Approx(-0.134471).epsilon(1e-5));
  CHECK(g[0][1].item<float>() == doctest::Approx(-0.134471).epsilon(1e-5));
  CHECK(g[1][0].item<float>() == doctest::Approx(0.134471).epsilon(1e-5));
  CHECK(g[1][1].item<float>() == 0.0f);
  // IPO, beta 0.5: (h - 1)^2 = 1; d/dh = 2 (h - 1) = 2.
  logp.grad().zero_();
  auto ipo = preference_loss(logp, mask, ref, 0.5, true);
  CHECK(ipo.loss.item<float>() == doctest::Approx(1.0));
  ipo.loss.backward();
  CHECK(logp.grad()[0][0].item<float>() == doctest::Approx(2.0));
  CHECK(logp.grad()[1][0].item<float>() == doctest::Approx(-2.0));
  CHECK(logp.grad()[1][1].item<float>() == 0.0f);
  // By name, through the Trainer's interface; an odd row count or a missing input is refused.
  troupe::actors::ObjectiveInput in{logp, mask, {{"ref_seq_logp", ref}}, {{"beta", 0.5}}, {}, {}};
  auto out = troupe::actors::find_objective("dpo")(in);
  CHECK(out.loss.item<float>() == doctest::Approx(0.313262).epsilon(1e-5));
  CHECK(out.metrics.at("reward_accuracy") == doctest::Approx(1.0));
  CHECK_THROWS_AS(troupe::actors::find_objective("dpo")(troupe::actors::ObjectiveInput{logp, mask, {}, {}, {}, {}}),
                  std::invalid_argument);
  CHECK_THROWS_AS(preference_loss(t2({-1, -2, -3}, 3), mask2({1, 1, 1}, 3), at::tensor({0.f, 0.f, 0.f}), 0.5, false),
                  std::invalid_argument);
}

TEST_CASE("the Bradley-Terry loss and its gradient match hand-computed values, with and without a margin") {
  auto scores = at::tensor({2.0f, 0.5f, 0.0f, 1.0f}).requires_grad_(true);
  // Pair 0: d = 1.5 -> log(1 + e^-1.5) = 0.201413; pair 1: d = -1 -> log(1 + e) = 1.313262; mean 0.757338.
  auto loss = bradley_terry_loss(scores);
  CHECK(loss.item<float>() == doctest::Approx(0.757338).epsilon(1e-5));
  loss.backward();
  // d/d chosen = -sigmoid(-d) / 2 (the mean over 2 pairs): -0.091213 and -0.365529; rejected: the opposite.
  CHECK(scores.grad()[0].item<float>() == doctest::Approx(-0.091213).epsilon(1e-4));
  CHECK(scores.grad()[1].item<float>() == doctest::Approx(0.091213).epsilon(1e-4));
  CHECK(scores.grad()[2].item<float>() == doctest::Approx(-0.365529).epsilon(1e-4));
  CHECK(bradley_terry_loss(at::tensor({2.0f, 0.5f}), 1.0).item<float>() == doctest::Approx(0.474077).epsilon(1e-5));
  CHECK_THROWS_AS(bradley_terry_loss(at::tensor({1.0f, 2.0f, 3.0f})), std::invalid_argument);
}

TEST_CASE("the Bradley-Terry objective adds the chosen rows' language-model loss with lm_coef") {
  // Two pairs; the score head's value at each row's last real token (column 1): 2.0, 0.5 | 0.0, 1.0,
  // the Bradley-Terry loss of the test above, 0.757338. Chosen rows 0 and 2: token log-probs
  // (-0.5, -1.5) and (-2.0, masked), so their NLL is mean(1.0, 2.0) = 1.5; with lm_coef 0.2 the loss
  // is 0.757338 + 0.3. Rejected rows carry no language-model gradient.
  auto logp = t2({-0.5f, -1.5f, -9.0f, -9.0f, -2.0f, -7.0f, -9.0f, -9.0f}, 4).requires_grad_(true);
  auto mask = mask2({1, 1, 1, 1, 1, 0, 1, 1}, 4);
  auto attn = at::ones({4, 2}, at::kBool);
  auto heads = at::tensor({0.0f, 2.0f, 0.0f, 0.5f, 0.0f, 0.0f, 0.0f, 1.0f}).view({4, 2});
  troupe::actors::ObjectiveInput in{logp, mask, {}, {{"lm_coef", 0.2}}, attn, {{"score", heads}}};
  auto out = troupe::actors::find_objective("bradley_terry")(in);
  CHECK(out.loss.item<float>() == doctest::Approx(1.057338).epsilon(1e-5));
  CHECK(out.metrics.at("chosen_nll") == doctest::Approx(1.5).epsilon(1e-6));
  CHECK(out.metrics.at("pair_accuracy") == doctest::Approx(0.5));
  out.loss.backward();
  // d/d logp of a chosen row's token: -lm_coef / (2 rows * its row's real tokens).
  CHECK(logp.grad()[0][0].item<float>() == doctest::Approx(-0.05).epsilon(1e-5));
  CHECK(logp.grad()[2][0].item<float>() == doctest::Approx(-0.1).epsilon(1e-5));
  CHECK(logp.grad()[2][1].item<float>() == doctest::Approx(0.0));
  CHECK(logp.grad()[1][0].item<float>() == doctest::Approx(0.0));
  in.options.clear();
  CHECK(troupe::actors::find_objective("bradley_terry")(in).metrics.count("chosen_nll") == 0);
}

TEST_CASE("the clipped value loss matches hand-computed values and gradients") {
  // Token 0: v 1.5, old 1.0, R 2.0, clip 0.2 -> v_clip 1.2: max(0.25, 0.64) = 0.64 (clipped: no gradient).
  // Token 1: v 0.0, old 0.1, R 1.0 -> v_clip 0.0: max(1, 1) = 1, the unclipped term's gradient v - R = -1.
  // Token 2 masked. Row mean 0.5 * (0.64 + 1) / 2 = 0.41; the gradient on token 1 is 0.5 * 2 (v - R) / 2 = -0.5.
  auto v = t2({1.5f, 0.0f, 7.0f}, 1).requires_grad_(true);
  auto old = t2({1.0f, 0.1f, 0.0f}, 1), ret = t2({2.0f, 1.0f, 0.0f}, 1);
  auto mask = mask2({1, 1, 0}, 1);
  auto vl = clipped_value_loss(v, old, ret, mask, 0.2);
  CHECK(vl.loss.item<float>() == doctest::Approx(0.41).epsilon(1e-5));
  CHECK(vl.clip_fraction == doctest::Approx(0.5));
  vl.loss.backward();
  CHECK(v.grad()[0][0].item<float>() == doctest::Approx(0.0));
  CHECK(v.grad()[0][1].item<float>() == doctest::Approx(-0.5).epsilon(1e-5));
  CHECK(v.grad()[0][2].item<float>() == 0.0f);
  // Without clipping: 0.5 * (0.25 + 1) / 2 = 0.3125.
  CHECK(clipped_value_loss(v, old, ret, mask, 0.0).loss.item<float>() == doctest::Approx(0.3125).epsilon(1e-5));
  CHECK_THROWS_AS(clipped_value_loss(v, old, t2({1.0f, 2.0f}, 1), mask, 0.2), std::invalid_argument);
}

namespace {

// Four groups of two samples, rows "1 2 | 3 4 5" (prompt | response), tokens varying by row.
troupe::actors::RolloutBatch two_sample_groups() {
  troupe::actors::RolloutBatch s;
  const std::int64_t n = 8, t = 5;
  s.tokens = troupe::TensorView::empty(troupe::DType::I64, {n, t});
  s.attn_mask = troupe::TensorView::empty(troupe::DType::Bool, {n, t});
  s.response_mask = troupe::TensorView::empty(troupe::DType::Bool, {n, t});
  s.logprobs = troupe::TensorView::empty(troupe::DType::F32, {n, t});
  for (std::int64_t r = 0; r < n; ++r) {
    for (std::int64_t c = 0; c < t; ++c) {
      s.tokens.data_as<std::int64_t>()[r * t + c] = 1 + (c * 3 + r) % 7;
      s.attn_mask.data_as<bool>()[r * t + c] = true;
      s.response_mask.data_as<bool>()[r * t + c] = c >= 2;
    }
  }
  s.prompt_len = 2;
  return s;
}

float max_weight_difference(troupe::actors::Trainer& a, troupe::actors::Trainer& b) {
  const auto wa = a.weights(), wb = b.weights();
  REQUIRE(wa.names == wb.names);
  float worst = 0;
  for (std::size_t i = 0; i < wa.tensors.size(); ++i) {
    for (std::int64_t k = 0; k < wa.tensors[i].numel(); ++k)
      worst = std::max(worst, std::abs(wa.tensors[i].data_as<float>()[k] - wb.tensors[i].data_as<float>()[k]));
  }
  return worst;
}

}  // namespace

TEST_CASE("GRPO's update leaves out the groups whose advantages are all 0 (beta 0), and takes the same step") {
  using namespace troupe::actors;
  register_grpo_objective();
  const auto samples = two_sample_groups();
  RunConfig c;
  c.algo.group_size = 2;
  c.algo.kl_coef = 0;
  c.algo.optim.lr = 1e-2;
  const std::vector<float> advantages = {1.0f, -1.0f, 0.0f, 0.0f, 0.5f, -0.5f, 0.0f, 0.0f};
  const PolicyConfig policy = testing::tiny_policy();   // vocabulary 8: the tokens above are 1-7

  SUBCASE("groups 1 and 3 (all 0) are left out; loss_rows keeps the mean over all 8 rows") {
    const auto skipped = grpo_batch(samples, troupe::TensorView{}, advantages, c);
    REQUIRE(skipped.tokens.shape == std::vector<std::int64_t>{4, 5});
    CHECK(skipped.loss_rows == 8);
    const std::int64_t kept[] = {0, 1, 4, 5};
    for (std::int64_t i = 0; i < 4; ++i) {
      for (std::int64_t col = 0; col < 5; ++col)
        CHECK(skipped.tokens.data_as<std::int64_t>()[i * 5 + col] == samples.tokens.data_as<std::int64_t>()[kept[i] * 5 + col]);
      CHECK(skipped.inputs.at("advantages").data_as<float>()[i] == advantages[std::size_t(kept[i])]);
    }
    c.algo.skip_zero_advantage = false;
    const auto full = grpo_batch(samples, troupe::TensorView{}, advantages, c);
    CHECK(full.tokens.shape[0] == 8);
    CHECK(full.loss_rows == 0);

    // One AdamW step on each: the same weights and the same loss.
    Trainer a(TrainerConfig{policy, c.algo.optim, 1}), b(TrainerConfig{policy, c.algo.optim, 1});
    const auto ma = a.train_step(full), mb = b.train_step(skipped);
    CHECK(mb.loss == doctest::Approx(ma.loss).epsilon(1e-6));
    CHECK(mb.grad_norm == doctest::Approx(ma.grad_norm).epsilon(1e-5));
    CHECK(ma.grad_norm > 0);
    CHECK(max_weight_difference(a, b) < 1e-6f);
  }
  SUBCASE("with a KL term every row has a gradient: nothing is left out") {
    c.algo.kl_coef = 0.04;
    auto ref = troupe::TensorView::empty(troupe::DType::F32, {8, 5});
    CHECK(grpo_batch(samples, ref, advantages, c).tokens.shape[0] == 8);
  }
  SUBCASE("a program's own objective gets every row") {
    c.algo.objective = "test_marked_grpo";
    CHECK(grpo_batch(samples, troupe::TensorView{}, advantages, c).tokens.shape[0] == 8);
  }
  SUBCASE("the skip follows grpo_objective, the function, not the name \"grpo\"") {
    register_objective("test_grpo_alias", &troupe::rl::grpo_objective);   // the same math under another name
    c.algo.objective = "test_grpo_alias";
    CHECK(grpo_batch(samples, troupe::TensorView{}, advantages, c).tokens.shape[0] == 4);
    // A program's own objective registered as "grpo" (here: GRPO's loss plus a term that every row
    // feeds, an entropy-like bonus) is not known to ignore a row whose advantage is 0.
    register_objective("grpo", [](const ObjectiveInput& in) {
      auto out = troupe::rl::grpo_objective(in);
      out.loss = out.loss + 0.01 * seq_mean_token_mean(in.logp, in.loss_mask);
      return out;
    });
    c.algo.objective = "grpo";
    CHECK(grpo_batch(samples, troupe::TensorView{}, advantages, c).tokens.shape[0] == 8);
    register_grpo_objective();   // the library's again, for the cases after this one
    CHECK(grpo_batch(samples, troupe::TensorView{}, advantages, c).tokens.shape[0] == 4);
  }
  SUBCASE("no group with a gradient: one group stands for the batch, and the step is the whole batch's") {
    const std::vector<float> zeros(8, 0.0f);
    const auto one = grpo_batch(samples, troupe::TensorView{}, zeros, c);
    CHECK(one.tokens.shape[0] == 2);
    CHECK(one.loss_rows == 8);
    c.algo.skip_zero_advantage = false;
    Trainer a(TrainerConfig{policy, c.algo.optim, 1}), b(TrainerConfig{policy, c.algo.optim, 1});
    a.train_step(grpo_batch(samples, troupe::TensorView{}, zeros, c));
    b.train_step(one);
    CHECK(max_weight_difference(a, b) == 0.0f);
  }
  SUBCASE("the trainer refuses loss_rows fewer than the batch's rows") {
    auto batch = grpo_batch(samples, troupe::TensorView{}, advantages, c);
    batch.loss_rows = 3;
    Trainer a(TrainerConfig{policy, c.algo.optim, 1});
    CHECK_THROWS_AS(a.train_step(batch), std::invalid_argument);
  }
}
