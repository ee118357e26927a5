// The RL roles through the actor runtime (torch-free: only TensorViews and messages).
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <ranges>

#include "troupe/actors/reference.hpp"
#include "troupe/actors/reward.hpp"
#include "troupe/actors/rollout_engine.hpp"
#include "troupe/actors/safetensors.hpp"
#include "troupe/actors/tokenizer.hpp"
#include "troupe/actors/trainer.hpp"

#include "fixtures.hpp"

using namespace troupe::actors;
using troupe::DType;
using troupe::TensorView;
using troupe::actors::testing::copy_batch;
using troupe::actors::testing::tiny_policy;

namespace {

bool same_weights(const Weights& a, const Weights& b) {
  if (a.names != b.names) return false;
  for (std::size_t i = 0; i < a.tensors.size(); ++i) {
    if (std::memcmp(a.tensors[i].data, b.tensors[i].data, a.tensors[i].nbytes()) != 0) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("the character tokenizer round-trips text and reserves pad and eos") {
  CharTokenizer tok("0123456789+=");
  CHECK(tok.vocab_size() == 14);
  CHECK(tok.pad_id() == 0);
  CHECK(tok.eos_id() == 1);
  auto ids = tok.encode("12+3=");
  CHECK(ids == std::vector<std::int32_t>({3, 4, 12, 5, 13}));
  ids.push_back(tok.eos_id());
  ids.insert(ids.begin(), tok.pad_id());
  CHECK(tok.decode(ids) == "12+3=");
  CHECK_THROWS_AS(tok.encode("1-2"), std::invalid_argument);
  CHECK_THROWS_AS(tok.decode({99}), std::out_of_range);
  CHECK_THROWS_AS(CharTokenizer("aba"), std::invalid_argument);
}

TEST_CASE("token rows: rows of their own lengths in one buffer, as spans, and through msgpack with their offsets checked") {
  const std::vector<std::vector<std::int32_t>> rows = {{3, 4, 5}, {}, {7}, {8, 9}};
  TokenRows t(rows);
  REQUIRE(t.size() == 4);
  CHECK(t.values() == std::vector<std::int32_t>{3, 4, 5, 7, 8, 9});
  CHECK(t.offsets() == std::vector<std::int64_t>{0, 3, 3, 4, 6});
  CHECK(t[1].empty());
  CHECK(t.at(3).size() == 2);
  CHECK(t.at(3)[1] == 9);
  CHECK_THROWS_AS(t.at(4), std::out_of_range);
  CHECK(t.to_vectors() == rows);
  std::size_t n = 0;
  for (auto row : t) CHECK(std::vector<std::int32_t>(row.begin(), row.end()) == rows[n++]);
  CHECK(n == 4);
  static_assert(std::ranges::forward_range<TokenRows>);
  CHECK(std::ranges::equal(*std::ranges::next(t.begin(), 2), std::vector<std::int32_t>{7}));
  CHECK(TokenRows{{3, 4, 5}, {}, {7}, {8, 9}} == t);
  CHECK(TokenRows().empty());

  RolloutBatch b;
  b.responses = t;
  auto back = troupe::decode_value<RolloutBatch>(troupe::encode_value(b));
  CHECK(back.responses == t);
  // Offsets a peer could send that do not fit the values: each a decode error.
  const std::vector<std::vector<std::int64_t>> bad = {{}, {1, 2}, {0, 2, 1, 2}, {0, 1}, {0, 3}};
  for (const auto& offsets : bad) {
    CAPTURE(offsets.size());
    troupe::Payload p;
    troupe::detail::VectorWriter w{&p.bytes};
    msgpack::packer<troupe::detail::VectorWriter> pk(w);
    pk.pack_array(2);
    pk.pack(std::vector<std::int32_t>{3, 4});
    pk.pack(offsets);
    CHECK_THROWS_AS(troupe::decode_value<TokenRows>(p), troupe::DecodeError);
  }
}

TEST_CASE("the integer verifier reports format validity apart from correctness") {
  Reward reward(RewardConfig{"integer", 0.1f});
  auto r = reward.score({{"42", "42", true}, {"41", "42", true}, {"42", "42", false}, {"4a", "42", true},
                         {"", "42", true}, {"042", "42", true}, {"-3", "-3", true}});
  REQUIRE(r.size() == 7);
  CHECK((r[0].correct && r[0].format_ok && r[0].reward == 1.0f));
  CHECK((!r[1].correct && r[1].format_ok && r[1].reward == doctest::Approx(0.1)));
  CHECK((!r[2].format_ok && r[2].reward == 0.0f));   // no stop token
  CHECK(!r[3].format_ok);
  CHECK(!r[4].format_ok);
  CHECK(r[5].correct);                               // the same integer
  CHECK(r[6].correct);
  CHECK_THROWS_AS(Reward(RewardConfig{"no such verifier", 0}), std::invalid_argument);
}

TEST_CASE("SFT steps through the actor API lower the loss and bump the policy version") {
  auto rt = troupe::Runtime::create().value();
  auto trainer = rt.spawn<Trainer>(troupe::Options{}.name("trainer"), TrainerConfig{tiny_policy(), OptimConfig{}, 1});
  auto first = trainer.call(&Trainer::train_step, copy_batch(8)).get();
  TrainMetrics last;
  for (int i = 0; i < 60; ++i) last = trainer.call(&Trainer::train_step, copy_batch(8)).get();
  CHECK(first.policy_version == 1);
  CHECK(last.policy_version == 61);
  CHECK(last.loss < 0.5 * first.loss);
  CHECK(first.tokens == 24);
  CHECK(first.entropy > 0.0);
}

TEST_CASE("gradient accumulation over micro-batches takes the same step as one batch") {
  // eps = 1 makes Adam's first update ~ lr * g (continuous in g), so rounding cannot flip a sign.
  OptimConfig smooth;
  smooth.eps = 1.0;
  Trainer a(TrainerConfig{tiny_policy(), smooth, 1}), b(TrainerConfig{tiny_policy(), smooth, 1});
  auto one = copy_batch(6), four = copy_batch(6);
  four.micro_batches = 3;
  auto ma = a.train_step(one);
  auto mb = b.train_step(four);
  CHECK(ma.loss == doctest::Approx(mb.loss).epsilon(1e-5));
  CHECK(ma.grad_norm == doctest::Approx(mb.grad_norm).epsilon(1e-4));
  auto wa = a.weights(), wb = b.weights();
  for (std::size_t i = 0; i < wa.tensors.size(); ++i) {
    for (std::int64_t j = 0; j < wa.tensors[i].numel(); ++j)
      CHECK(std::abs(wa.tensors[i].data_as<float>()[j] - wb.tensors[i].data_as<float>()[j]) < 1e-7);
  }
}

TEST_CASE("every rollout row carries the policy version it was sampled with (RL-1)") {
  auto rt = troupe::Runtime::create().value();
  auto trainer = rt.spawn<Trainer>(troupe::Options{}, TrainerConfig{tiny_policy(), OptimConfig{}, 1});
  auto rollout = rt.spawn<RolloutEngine>(troupe::Options{}, RolloutConfig{tiny_policy(), 1, true});
  GenerateRequest req{{{1, 2}, {3}}, 3, SamplingParams{1.0f, 1.0f, 4, 7, 11}, {}, 0};
  auto before = rollout.call(&RolloutEngine::generate, req).get();
  CHECK(before.policy_version == std::vector<std::int64_t>(6, 0));
  trainer.call(&Trainer::train_step, copy_batch(4)).get();
  trainer.call(&Trainer::train_step, copy_batch(4)).get();
  auto w = trainer.call(&Trainer::weights).get();
  CHECK(rollout.call(&RolloutEngine::update_weights, w).get() == 2);
  auto after = rollout.call(&RolloutEngine::generate, req).get();
  CHECK(after.policy_version == std::vector<std::int64_t>(6, 2));
  CHECK(after.tokens.shape[0] == 6);
  CHECK(after.prompt_len == 2);
}

TEST_CASE("weights go trainer -> weight store -> rollout engine, version tagged, identical bytes") {
  auto rt = troupe::Runtime::create().value();
  auto trainer = rt.spawn<Trainer>(troupe::Options{}, TrainerConfig{tiny_policy(), OptimConfig{}, 1});
  auto rollout = rt.spawn<RolloutEngine>(troupe::Options{}, RolloutConfig{tiny_policy(), 1, true});
  auto store = rt.spawn<troupe::WeightStore>(troupe::Options{});
  const auto version0 = std::filesystem::temp_directory_path() / ("troupe-roles-publish-" + std::to_string(::getpid()));
  trainer.call(&Trainer::save_checkpoint, version0.string()).get();
  CHECK(trainer.call(&Trainer::publish_to, store).get() == 0);
  CHECK(trainer.call(&Trainer::publish_to, store).get() == 0);   // already there: not published twice
  CHECK(rollout.call(&RolloutEngine::pull_weights, store).get() == 0);
  trainer.call(&Trainer::train_step, copy_batch(4)).get();
  CHECK(trainer.call(&Trainer::publish_to, store).get() == 1);
  CHECK(store.call(&troupe::WeightStore::latest_version).get() == 1 + std::uint64_t(kStoreVersionOffset));
  store.call(&troupe::WeightStore::clear).get();   // forgotten: the same version again is published, not taken as there
  CHECK(store.call(&troupe::WeightStore::latest_version).get() == 0);
  CHECK(trainer.call(&Trainer::publish_to, store).get() == 1);
  CHECK(store.call(&troupe::WeightStore::latest_version).get() == 1 + std::uint64_t(kStoreVersionOffset));
  CHECK(rollout.call(&RolloutEngine::pull_weights, store).get() == 1);
  GenerateRequest req{{{1, 2}, {3}}, 2, SamplingParams{1.0f, 1.0f, 4, 7, 11}, {}, 0};
  CHECK(rollout.call(&RolloutEngine::generate, req).get().policy_version == std::vector<std::int64_t>(4, 1));
  // The engine serves exactly the trainer's parameters: same samples as an engine given them directly.
  auto direct = rt.spawn<RolloutEngine>(troupe::Options{}, RolloutConfig{tiny_policy(), 1, true});
  direct.call(&RolloutEngine::update_weights, trainer.call(&Trainer::weights).get()).get();
  auto a = rollout.call(&RolloutEngine::generate, req).get(), b = direct.call(&RolloutEngine::generate, req).get();
  REQUIRE(a.logprobs.numel() == b.logprobs.numel());
  for (std::int64_t i = 0; i < a.logprobs.numel(); ++i) CHECK(a.logprobs.data_as<float>()[i] == b.logprobs.data_as<float>()[i]);
  CHECK(a.responses == b.responses);
  // Version 0 loaded again, after publishes: a version older than the store's is refused, not published.
  CHECK(trainer.call(&Trainer::load_checkpoint, version0.string()).get() == 0);
  CHECK_THROWS_WITH_AS(trainer.call(&Trainer::publish_to, store).get(), doctest::Contains("newer than this trainer's"),
                       troupe::CallError);
  std::filesystem::remove_all(version0);
}

TEST_CASE("the reference scores a batch with the logprobs its sampler reported") {
  auto rt = troupe::Runtime::create().value();
  auto rollout = rt.spawn<RolloutEngine>(troupe::Options{}, RolloutConfig{tiny_policy(), 1, true});
  auto reference = rt.spawn<Reference>(troupe::Options{}, ReferenceConfig{tiny_policy(), "", 1});
  GenerateRequest req{{{1, 2, 3}, {4, 5}}, 4, SamplingParams{1.0f, 1.0f, 5, -1, 5}, {}, 0};
  auto batch = rollout.call(&RolloutEngine::generate, req).get();
  auto ref = reference.call(&Reference::logprobs, LogprobRequest{batch.tokens, batch.attn_mask, 1.0f}).get();
  REQUIRE(ref.shape == batch.logprobs.shape);
  const auto* mask = batch.response_mask.data_as<bool>();
  int checked = 0;
  for (std::int64_t i = 0; i < ref.numel(); ++i) {
    if (!mask[i]) continue;
    CHECK(ref.data_as<float>()[i] == doctest::Approx(batch.logprobs.data_as<float>()[i]).epsilon(1e-4));
    ++checked;
  }
  CHECK(checked == 8 * 5);
}

TEST_CASE("a trainer checkpoint restores weights, optimizer and version bit for bit") {
  const auto dir = (std::filesystem::temp_directory_path() / ("troupe_trainer_ckpt-" + std::to_string(::getpid()))).string();
  std::filesystem::remove_all(dir);
  Trainer a(TrainerConfig{tiny_policy(), OptimConfig{}, 1});
  for (int i = 0; i < 3; ++i) a.train_step(copy_batch(4));
  a.save_checkpoint(dir);
  Trainer b(TrainerConfig{tiny_policy(), OptimConfig{}, 1});
  CHECK(b.load_checkpoint(dir) == 3);
  CHECK(same_weights(a.weights(), b.weights()));
  auto ma = a.train_step(copy_batch(4));
  auto mb = b.train_step(copy_batch(4));
  CHECK(ma.loss == mb.loss);
  CHECK(ma.policy_version == mb.policy_version);
  CHECK(same_weights(a.weights(), b.weights()));
  std::filesystem::remove_all(dir);
}

// A checkpoint is checked whole before anything changes (actors/src/trainer.cpp): before, a
// mismatch part-way through the copy left the weights half overwritten, and a later file's
// failure left new weights with old moments.
TEST_CASE("a checkpoint that does not fit the trainer changes nothing: another model's shapes, a mixed pair of files, a bad optimizer state") {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / ("troupe_trainer_bad_ckpt-" + std::to_string(::getpid()));
  fs::remove_all(root);
  Trainer a(TrainerConfig{tiny_policy(), OptimConfig{}, 1});
  for (int i = 0; i < 3; ++i) a.train_step(copy_batch(4));
  a.save_checkpoint((root / "a").string());
  a.train_step(copy_batch(4));
  a.save_checkpoint((root / "a4").string());

  // The twin c takes the same steps as b; b's refused loads must leave it c's equal.
  PolicyConfig longer = tiny_policy();
  longer.context = 24;   // pos_emb [24, d]: tok_emb fits, pos_emb does not
  Trainer b(TrainerConfig{longer, OptimConfig{}, 1}), c(TrainerConfig{longer, OptimConfig{}, 1});
  b.train_step(copy_batch(4));
  c.train_step(copy_batch(4));
  CHECK_THROWS_AS(b.load_checkpoint((root / "a").string()), std::invalid_argument);
  CHECK(same_weights(b.weights(), c.weights()));
  CHECK(b.policy_version() == 1);
  CHECK(b.train_step(copy_batch(4)).loss == c.train_step(copy_batch(4)).loss);   // the moments too
  CHECK(same_weights(b.weights(), c.weights()));

  // policy.safetensors of step 3 with optimizer.safetensors of step 4: not one checkpoint.
  fs::copy_file(root / "a4" / "optimizer.safetensors", root / "a" / "optimizer.safetensors", fs::copy_options::overwrite_existing);
  Trainer d(TrainerConfig{tiny_policy(), OptimConfig{}, 1});
  const Weights fresh = d.weights();
  const auto refusal = [&](const fs::path& dir) {   // load_checkpoint's refusal, with d left fresh
    std::string why = "(loaded)";
    try {
      d.load_checkpoint(dir.string());
    } catch (const std::invalid_argument& e) {
      why = e.what();
    }
    CHECK(same_weights(d.weights(), fresh));
    CHECK(d.policy_version() == 0);
    return why;
  };
  CHECK(refusal(root / "a").find("not one checkpoint") != std::string::npos);

  // A step count of -1 (the next step's bias correction divided by zero: every weight NaN).
  const auto optim_path = (root / "a4" / "optimizer.safetensors").string();
  auto optim = read_safetensors(optim_path);
  optim.metadata["steps"] = "-1";
  write_safetensors(optim_path, optim.tensors, optim.metadata);
  CHECK(refusal(root / "a4").find("'steps'") != std::string::npos);
  fs::remove_all(root);
}

// load_trunk_as(path, "score", "value") on a file that has both heads: the file's score head
// becomes the value head (before, the file's own value head, later in the file, won).
TEST_CASE("load_trunk_as takes the head it names, even from a file that has the target head too") {
  const auto path = (std::filesystem::temp_directory_path() / ("troupe_two_heads-" + std::to_string(::getpid()) + ".safetensors")).string();
  PolicyConfig both = tiny_policy();
  both.scalar_heads = {"score", "value"};
  Trainer source(TrainerConfig{both, OptimConfig{}, 1});
  source.save_weights(path);
  PolicyConfig critic = tiny_policy();
  critic.scalar_heads = {"value"};
  Trainer t(TrainerConfig{critic, OptimConfig{}, 1});
  CHECK(t.load_trunk_as(path, "score", "value").empty());
  const auto tensor = [](const Weights& w, const std::string& name) {
    for (std::size_t i = 0; i < w.names.size(); ++i) if (w.names[i] == name) return w.tensors[i];
    FAIL("no tensor " << name);
    return TensorView{};
  };
  const TensorView want = tensor(source.weights(), "score_head.weight"), got = tensor(t.weights(), "value_head.weight");
  REQUIRE(got.nbytes() == want.nbytes());
  CHECK(std::memcmp(got.data, want.data, got.nbytes()) == 0);
  CHECK(std::memcmp(got.data, tensor(source.weights(), "value_head.weight").data, got.nbytes()) != 0);
  std::filesystem::remove(path);
}

// The Trainer reads a batch's masks and inputs by its tokens' shape: anything else is refused by
// name (a loss mask one column short was read past its end by the objectives' kernels).
TEST_CASE("train_step refuses masks and inputs that do not match the batch's tokens, naming them") {
  Trainer t(TrainerConfig{tiny_policy(), OptimConfig{}, 1});
  const auto refusal = [&](const TrainBatch& b) {
    try {
      t.train_step(b);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  auto short_mask = copy_batch(2);
  short_mask.loss_mask = TensorView::empty(DType::Bool, {2, 4});
  CHECK(refusal(short_mask).find("loss_mask") != std::string::npos);
  auto short_attn = copy_batch(2);
  short_attn.attn_mask = TensorView::empty(DType::Bool, {2, 6});
  CHECK(refusal(short_attn).find("attn_mask") != std::string::npos);
  auto rows = copy_batch(2);
  rows.inputs["advantages"] = TensorView::empty(DType::F32, {3});
  CHECK(refusal(rows).find("'advantages'") != std::string::npos);
  CHECK(t.policy_version() == 0);
  CHECK(refusal(copy_batch(2)) == "(accepted)");
}

TEST_CASE("an unknown objective or a bad weights file fails the call, not the process") {
  auto rt = troupe::Runtime::create().value();
  auto trainer = rt.spawn<Trainer>(troupe::Options{}, TrainerConfig{tiny_policy(), OptimConfig{}, 1});
  auto batch = copy_batch(2);
  batch.objective = "nope";
  auto r = trainer.call(&Trainer::train_step, batch).result();
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message.find("nope") != std::string::npos);
  auto reference = rt.spawn<Reference>(troupe::Options{}, ReferenceConfig{tiny_policy(), "", 1});
  auto bad = reference.call(&Reference::load_weights, std::string("/nonexistent.safetensors")).result();
  CHECK_FALSE(bad.ok());
}

