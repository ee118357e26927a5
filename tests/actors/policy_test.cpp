// The policy model, generation, the tensor bridge and AdamW (the one ATen file of actors_tests).
#include <doctest/doctest.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>

#include "support/doctest_after_torch.hpp"   // ATen redefines CHECK

#include "troupe/actors/generate.hpp"
#include "troupe/actors/objective.hpp"
#include "troupe/actors/optimizer.hpp"
#include "troupe/actors/policy.hpp"
#include "troupe/actors/tensor_bridge.hpp"
#include "troupe/actors/trainer.hpp"

#include "fixtures.hpp"

using namespace troupe::actors;

namespace {

PolicyConfig config(std::uint64_t seed = 5) {
  PolicyConfig c;
  c.vocab_size = 11;
  c.context = 24;
  c.layers = 2;
  c.d_model = 32;
  c.heads = 4;
  c.seed = seed;
  return c;
}

// Variable-length prompts, so left padding is exercised.
const std::vector<std::vector<std::int32_t>> kPrompts = {{3, 4, 5, 6, 7}, {2}, {9, 8, 7}, {1, 10}};

}  // namespace

TEST_CASE("KV-cache generation equals no-cache generation token for token") {
  Policy policy(config());
  for (float temperature : {0.0f, 1.0f, 0.7f}) {
    SamplingParams sp{temperature, temperature == 0.7f ? 0.9f : 1.0f, 12, 2, 42};
    auto cached = generate(policy, kPrompts, 3, sp, true);
    auto plain = generate(policy, kPrompts, 3, sp, false);
    CAPTURE(temperature);
    CHECK(at::equal(cached.tokens, plain.tokens));
    CHECK(at::equal(cached.response_mask, plain.response_mask));
    CHECK(cached.responses == plain.responses);
    CHECK(cached.finished == plain.finished);
    CHECK(at::allclose(cached.logprobs, plain.logprobs, 1e-5, 1e-5));
  }
}

TEST_CASE("a prompt's samples share one prefill: the KV cache repeats its rows, as if each row were prefilled") {
  Policy policy(config(7));
  const std::int64_t width = 4, max_len = 8, repeats = 3;
  auto tokens = at::tensor(std::vector<std::int64_t>{0, 3, 4, 5, 2, 9, 8, 7}).view({2, width});
  auto mask = at::tensor(std::vector<std::int64_t>{0, 1, 1, 1, 1, 1, 1, 1}).view({2, width}).to(at::kBool);
  at::NoGradGuard no_grad;
  KvCache once(policy.config(), 2, max_len), every(policy.config(), 2 * repeats, max_len), shared(policy.config(), 2 * repeats, max_len);
  auto first = policy.forward(tokens, positions_from_mask(mask), mask, &once, 0);
  auto rows = tokens.repeat_interleave(repeats, 0), rows_mask = mask.repeat_interleave(repeats, 0);
  auto all = policy.forward(rows, positions_from_mask(rows_mask), rows_mask, &every, 0);
  REQUIRE(shared.repeat_rows(once, repeats, width));
  CHECK(at::allclose(first.repeat_interleave(repeats, 0), all, 1e-5, 1e-5));
  for (std::size_t l = 0; l < 2; ++l) {
    CHECK(at::allclose(shared.keys(l).narrow(2, 0, width), every.keys(l).narrow(2, 0, width), 1e-5, 1e-5));
    CHECK(at::allclose(shared.values(l).narrow(2, 0, width), every.values(l).narrow(2, 0, width), 1e-5, 1e-5));
  }
  KvCache wrong(policy.config(), 5, max_len);
  CHECK_THROWS_AS(wrong.repeat_rows(once, repeats, width), std::invalid_argument);
  CHECK_THROWS_AS(shared.repeat_rows(once, repeats, max_len + 1), std::invalid_argument);
}

TEST_CASE("a decode cache kept from call to call (a rollout engine's) gives the tokens a fresh one does") {
  Policy policy(config(9));
  const std::vector<std::vector<std::int32_t>> longer = {{3, 4, 5, 6, 7, 8, 9}, {2}, {9, 8, 7}, {1, 10}, {4, 4}};
  std::unique_ptr<DecodeCache> keep;
  // Small, then larger (a new cache), then smaller again (the larger one's memory, holding the
  // larger call's keys and values where this call does not write), each against a fresh cache.
  const struct {
    const std::vector<std::vector<std::int32_t>>* prompts;
    std::int32_t samples, max_new;
    bool fits;   // the kept cache is reused
  } calls[] = {{&kPrompts, 2, 4, false}, {&longer, 3, 10, false}, {&kPrompts, 3, 8, true}, {&kPrompts, 1, 3, true}};
  for (const auto& c : calls) {
    SamplingParams sp{1.0f, 1.0f, c.max_new, 2, 17};
    const DecodeCache* before = keep.get();
    auto kept = generate(policy, *c.prompts, c.samples, sp, true, {}, &keep);
    auto fresh = generate(policy, *c.prompts, c.samples, sp, true);
    CAPTURE(c.max_new);
    REQUIRE(keep != nullptr);
    CHECK((keep.get() == before) == c.fits);
    CHECK(at::equal(kept.tokens, fresh.tokens));
    CHECK(at::equal(kept.logprobs, fresh.logprobs));
    CHECK(kept.responses == fresh.responses);
  }
  KvCache small(policy.config(), 2, 4);
  CHECK(small.reuse(1, 8));
  CHECK(small.keys(0).sizes() == at::IntArrayRef{1, 4, 8, 8});
  CHECK_FALSE(small.reuse(3, 4));
  CHECK(small.keys(0).sizes() == at::IntArrayRef{1, 4, 8, 8});   // unchanged by a refusal
  CHECK_FALSE(small.reuse(0, 4));
}

TEST_CASE("left padding does not change a prompt's continuation") {
  Policy policy(config(9));
  SamplingParams greedy{0.0f, 1.0f, 8, -1, 0};
  auto batch = generate(policy, kPrompts, 1, greedy, true);
  for (std::size_t i = 0; i < kPrompts.size(); ++i) {
    auto alone = generate(policy, {kPrompts[i]}, 1, greedy, true);
    CHECK(std::ranges::equal(alone.responses[0], batch.responses[i]));
  }
}

TEST_CASE("generation logprobs equal a full forward pass over the sampled sequences") {
  Policy policy(config());
  auto g = generate(policy, kPrompts, 2, SamplingParams{1.0f, 1.0f, 6, -1, 3}, true);
  at::NoGradGuard no_grad;
  auto lp = token_logprobs(policy, g.tokens, g.attn_mask, 1.0f);
  auto m = g.response_mask;
  CHECK(at::allclose(lp.masked_select(m), g.logprobs.masked_select(m), 1e-5, 1e-5));
  // The ATen (autograd) path and the fused kernel path agree too.
  policy.set_requires_grad(true);
  at::Tensor entropy;
  {
    at::AutoGradMode grad(true);
    auto lp_grad = token_logprobs(policy, g.tokens, g.attn_mask, 1.0f, &entropy);
    CHECK(lp_grad.requires_grad());
    CHECK(at::allclose(lp_grad.detach(), lp, 1e-5, 1e-5));
  }
  CHECK((entropy.masked_select(m) > 0).all().item<bool>());
  CHECK((entropy.masked_select(m) <= std::log(11.0) + 1e-5).all().item<bool>());
}

TEST_CASE("generation stops rows at the stop token and pads them afterwards") {
  Policy policy(config(1));
  auto g = generate(policy, kPrompts, 4, SamplingParams{1.5f, 1.0f, 10, 2, 8}, true);
  auto tok = g.tokens.accessor<std::int64_t, 2>();
  auto resp = g.response_mask.accessor<bool, 2>();
  int stopped = 0;
  for (std::int64_t r = 0; r < g.tokens.size(0); ++r) {
    bool after_stop = false;
    for (std::int64_t c = g.prompt_len; c < g.tokens.size(1); ++c) {
      if (after_stop) { CHECK_FALSE(resp[r][c]); CHECK(tok[r][c] == 0); }
      if (resp[r][c] && tok[r][c] == 2) after_stop = true;
    }
    stopped += g.finished[std::size_t(r)];
    CHECK(bool(g.finished[std::size_t(r)]) == after_stop);
  }
  CHECK(stopped > 0);
  CHECK(g.generated_tokens == g.response_mask.sum().item<std::int64_t>());
}

// One uniform per row from the rows' own streams, as generate draws them.
at::Tensor row_uniforms(std::int64_t rows, std::uint64_t seed) {
  auto u = at::empty({rows}, at::kDouble);
  for (std::int64_t r = 0; r < rows; ++r) u[r] = uniform(sample_stream(seed, r, 0), 0);
  return u;
}

TEST_CASE("sampling draws each token with its probability, and top-p only from the nucleus") {
  auto logits = at::log(at::tensor({0.5f, 0.3f, 0.15f, 0.05f})).view({1, 4}).repeat({4000, 1});
  at::Tensor lp;
  auto all = sample_tokens(logits, SamplingParams{1.0f, 1.0f, 1, -1, 0}, row_uniforms(4000, 3), &lp);
  // Binomial(4000, p): within 4.5 standard deviations of its mean.
  const double expect[] = {0.5, 0.3, 0.15, 0.05};
  for (int k = 0; k < 4; ++k) {
    const double n = double((all == k).sum().item<std::int64_t>()), mean = 4000 * expect[k];
    CHECK(std::abs(n - mean) < 4.5 * std::sqrt(mean * (1 - expect[k])));
  }
  auto tokens = sample_tokens(logits, SamplingParams{1.0f, 0.7f, 1, -1, 0}, row_uniforms(4000, 1), &lp);
  CHECK((tokens <= 1).all().item<bool>());   // 0.5 + 0.3 reaches 0.7: tokens 2 and 3 are cut
  CHECK((tokens == 1).sum().item<std::int64_t>() > 1000);
  CHECK(at::allclose(lp.masked_select(tokens == 0), at::full({1}, std::log(0.5f)), 1e-5, 1e-5));
  // A token of probability 0 is never drawn, whatever the uniform.
  auto zero = at::log(at::tensor({0.0f, 1.0f, 0.0f})).view({1, 3}).repeat({3, 1});
  auto edge = at::tensor({1e-16, 0.5, 1.0 - 1e-16}, at::kDouble);
  CHECK((sample_tokens(zero, SamplingParams{1.0f, 1.0f, 1, -1, 0}, edge, nullptr) == 1).all().item<bool>());
}

TEST_CASE("a sample's tokens do not depend on how its batch is split into requests") {
  Policy policy(config());
  const std::vector<std::vector<std::int32_t>> prompts = {{3, 4, 5, 6, 7}, {2}, {9, 8, 7}, {1, 10}, {4}, {6, 5}};
  for (float top_p : {1.0f, 0.8f}) {
    const SamplingParams params{1.0f, top_p, 8, 2, 17};
    auto whole = generate(policy, prompts, 3, params, true);
    // Parts of 1, 3 and 2 prompts, not contiguous, each told its prompts' places and the whole
    // batch's width (5), as the GRPO driver splits a step by cost.
    const std::vector<std::vector<std::int64_t>> parts = {{3}, {4, 0, 2}, {5, 1}};
    for (std::size_t k = 0; k < parts.size(); ++k) {
      std::vector<std::vector<std::int32_t>> mine;
      for (auto i : parts[k]) mine.push_back(prompts[std::size_t(i)]);
      auto part = generate(policy, mine, 3, params, k != 1, BatchPart{parts[k], 5});
      REQUIRE(part.prompt_len == whole.prompt_len);
      const auto width = part.tokens.size(1);
      CHECK(width <= whole.tokens.size(1));
      for (std::size_t j = 0; j < parts[k].size(); ++j) {
        for (std::int64_t s = 0; s < 3; ++s) {
          const std::int64_t r = std::int64_t(j) * 3 + s, w = parts[k][j] * 3 + s;
          CHECK(at::equal(part.tokens[r], whole.tokens[w].narrow(0, 0, width)));
          CHECK((whole.tokens[w].narrow(0, width, whole.tokens.size(1) - width) == 0).all().item<bool>());   // nothing past it
          CHECK(at::allclose(part.logprobs[r], whole.logprobs[w].narrow(0, 0, width), 1e-5, 1e-6));
          CHECK(std::ranges::equal(part.responses[std::size_t(r)], whole.responses[std::size_t(w)]));
          CHECK(part.finished[std::size_t(r)] == whole.finished[std::size_t(w)]);
        }
      }
    }
  }
  // A prompt longer than the width it was given is refused.
  CHECK_THROWS_AS(generate(policy, {{1, 2, 3}}, 1, SamplingParams{}, true, BatchPart{{0}, 2}), std::invalid_argument);
  CHECK_THROWS_AS(generate(policy, {{1, 2, 3}}, 1, SamplingParams{}, true, BatchPart{{0, 1}, 0}), std::invalid_argument);
  CHECK_THROWS_AS(generate(policy, {{1, 2, 3}}, 1, SamplingParams{}, true, BatchPart{{-1}, 0}), std::invalid_argument);
}

TEST_CASE("scalar heads: one value per position from the same pass, and a model with one starts from a policy's trunk") {
  PolicyConfig with = config();
  with.scalar_heads = {"score", "value"};
  Policy plain(config()), headed(with);
  CHECK(headed.parameters().size() == plain.parameters().size() + 4);
  const auto tokens = at::tensor({1, 2, 3, 4, 5, 6}, at::kLong).view({2, 3});
  const auto attn = at::ones({2, 3}, at::kBool);
  const auto kept = headed.load_trunk(plain.views());
  CHECK(kept == std::vector<std::string>{"score", "value"});   // left as initialised
  at::NoGradGuard no_grad;
  auto out = headed.forward_outputs(tokens, positions_from_mask(attn), attn);
  REQUIRE(out.heads.count("score") == 1);
  CHECK(out.heads.at("score").sizes() == at::IntArrayRef({2, 3}));
  CHECK(at::equal(out.logits, plain.forward(tokens, positions_from_mask(attn), attn)));   // the trunk came over
  CHECK_FALSE(at::equal(out.heads.at("score"), out.heads.at("value")));
  CHECK_FALSE(headed.forward_outputs(tokens, positions_from_mask(attn), attn, false).logits.defined());
  // A policy cannot load a file without its heads, nor a trunk missing a parameter.
  CHECK_THROWS_AS(headed.load(plain.views()), std::invalid_argument);
  auto partial = plain.views();
  partial.pop_back();
  CHECK_THROWS_AS(headed.load_trunk(partial), std::invalid_argument);
  // Each row's last real token, in the left-padded, right-padded layout.
  auto mask = at::tensor({0, 1, 1, 0, 1, 1, 1, 1, 0}, at::kLong).view({3, 3}).to(at::kBool);
  CHECK(at::equal(last_token_index(mask), at::tensor({2, 2, 1}, at::kLong)));
  with.scalar_heads = {"lm"};
  CHECK_THROWS_AS(Policy{with}, std::invalid_argument);
}

TEST_CASE("a bad context, prompt or token id is refused") {
  Policy policy(config());
  CHECK_THROWS_AS(generate(policy, {{1, 2, 3}}, 1, SamplingParams{0, 1, 22, -1, 0}), std::invalid_argument);
  CHECK_THROWS_AS(generate(policy, {{}}, 1, SamplingParams{}), std::invalid_argument);
  CHECK_THROWS_AS(generate(policy, {{11}}, 1, SamplingParams{}), std::invalid_argument);
  PolicyConfig odd = config();
  odd.heads = 5;
  CHECK_THROWS_AS(Policy{odd}, std::invalid_argument);
  // A key mask of other rows than the tokens' (the fused attention reads one row per batch row).
  auto tokens = at::ones({2, 4}, at::kLong);
  auto positions = at::arange(4, at::kLong).repeat({2, 1});
  CHECK_THROWS_AS(policy.forward(tokens, positions, at::ones({3, 4}, at::kBool)), std::invalid_argument);
  CHECK(policy.forward(tokens, positions, at::ones({2, 4}, at::kBool)).sizes() == at::IntArrayRef({2, 4, 11}));
}

TEST_CASE("the tensor bridge shares memory both ways") {
  auto t = at::arange(6, at::kFloat).view({2, 3});
  auto v = to_view(t);
  CHECK(v.data == t.data_ptr());
  CHECK(v.shape == std::vector<std::int64_t>({2, 3}));
  auto back = from_view(v);
  back.mul_(2);
  CHECK(t[1][2].item<float>() == 10.0f);
  auto tt = to_view(t.t());   // non-contiguous views keep their strides
  CHECK(tt.strides == std::vector<std::int64_t>({1, 3}));
  CHECK(at::equal(from_view(tt), t.t()));
  auto owned = to_owned_view(t);
  CHECK(owned.data != t.data_ptr());
}

TEST_CASE("policy weights round-trip through safetensors and a wrong shape is refused") {
  Policy a(config(1)), b(config(2));
  auto file = parse_safetensors(serialize_safetensors(a.views()));
  b.load(file.tensors);
  for (std::size_t i = 0; i < a.parameters().size(); ++i)
    CHECK(at::equal(a.parameters()[i].second, b.parameters()[i].second));
  PolicyConfig wide = config(1);
  wide.d_model = 48;
  Policy c(wide);
  CHECK_THROWS_AS(c.load(file.tensors), std::invalid_argument);
  auto missing = file.tensors;
  missing.pop_back();
  CHECK_THROWS_AS(b.load(missing), std::invalid_argument);
}

TEST_CASE("AdamW's first steps match hand-computed values") {
  // One parameter p = 1 with gradient 0.5 each step; lr 0.1, betas (0.9, 0.99), eps 1e-8, decay 0.1.
  //   step 1: p *= 1 - 0.1*0.1 -> 0.99; m = 0.05, v = 0.0025; m_hat = 0.5, v_hat = 0.25
  //           p -= 0.1 * 0.5 / (0.5 + 1e-8) -> 0.89
  //   step 2: p *= 0.99 -> 0.8811; m = 0.095, v = 0.004975; m_hat = 0.5, v_hat = 0.25 -> p = 0.7811
  auto p = at::ones({1}).requires_grad_(true);
  OptimConfig c;
  c.lr = 0.1;
  c.weight_decay = 0.1;
  c.max_grad_norm = 0;
  AdamW opt({{"p", p}}, c);
  for (double expected : {0.89, 0.7811}) {
    p.mutable_grad() = at::full({1}, 0.5f);
    opt.step();
    CHECK(p.item<double>() == doctest::Approx(expected).epsilon(1e-6));
  }
  CHECK(opt.steps() == 2);
}

TEST_CASE("gradient clipping scales the global norm down to the limit and reports it") {
  auto a = at::zeros({2}).requires_grad_(true), b = at::zeros({1}).requires_grad_(true);
  OptimConfig c;
  c.max_grad_norm = 1.0;
  AdamW opt({{"a", a}, {"b", b}}, c);
  a.mutable_grad() = at::tensor({3.0f, 0.0f});
  b.mutable_grad() = at::tensor({4.0f});
  CHECK(opt.clip_gradients() == doctest::Approx(5.0));
  CHECK(a.grad()[0].item<float>() == doctest::Approx(0.6f).epsilon(1e-5));
  CHECK(b.grad()[0].item<float>() == doctest::Approx(0.8f).epsilon(1e-5));
}

namespace {
std::vector<std::int64_t> g_part_rows;   // the rows of each micro-batch the recording objective saw
troupe::actors::ObjectiveOutput record_rows(const troupe::actors::ObjectiveInput& in) {
  g_part_rows.push_back(in.logp.size(0));
  return troupe::actors::sft_objective(in);
}
}  // namespace

TEST_CASE("micro-batches hold whole row groups (a pair, a GRPO group), and a batch of partial groups is refused") {
  troupe::actors::register_objective("test_record_rows", &record_rows);
  troupe::actors::Trainer t(troupe::actors::TrainerConfig{troupe::actors::testing::tiny_policy(), troupe::actors::OptimConfig{}, 1});
  auto b = troupe::actors::testing::copy_batch(6);
  b.objective = "test_record_rows";
  b.micro_batches = 4;
  b.row_group = 2;   // three pairs in at most four parts: one pair each
  g_part_rows.clear();
  (void)t.train_step(b);
  CHECK(g_part_rows == std::vector<std::int64_t>{2, 2, 2});
  b.row_group = 3;   // two groups of three: never split
  g_part_rows.clear();
  (void)t.train_step(b);
  CHECK(g_part_rows == std::vector<std::int64_t>{3, 3});
  b.micro_batches = 1;
  g_part_rows.clear();
  (void)t.train_step(b);
  CHECK(g_part_rows == std::vector<std::int64_t>{6});
  b.row_group = 4;
  CHECK_THROWS_AS(t.train_step(b), std::invalid_argument);
}

// A call_sync runs a method on its caller's thread, whatever that thread's libtorch settings.
TEST_CASE("a compute method sets its own threads and autograd for its duration, and gives the caller's back") {
  using troupe::actors::testing::copy_batch;
  using troupe::actors::testing::tiny_policy;
  Trainer trainer(TrainerConfig{tiny_policy(), OptimConfig{}, 1});
  (void)at::get_num_threads();   // this thread's count set, as its first op would
  const int threads = at::get_num_threads();
  {
    const ComputeScope scope(threads + 1);
    CHECK(at::get_num_threads() == threads + 1);
    CHECK(at::GradMode::is_enabled());
  }
  CHECK(at::get_num_threads() == threads);
  {
    at::NoGradGuard no_grad;   // a caller in a no-grad scope: the step still trains
    const auto m = trainer.train_step(copy_batch(4));
    CHECK(m.policy_version == 1);
    CHECK(std::isfinite(m.loss));
    CHECK_FALSE(at::GradMode::is_enabled());   // and the caller's mode is back
  }
  {
    c10::InferenceMode inference;   // a caller in inference mode too
    CHECK(trainer.train_step(copy_batch(4)).policy_version == 2);
    CHECK(c10::InferenceMode::is_enabled());
  }
}
