// A program's own model architecture (TROUPE_MODEL): the trainer, the rollout engine and the
// reference compute with it, in this process and in worker processes, and algorithms run on it.
#include <doctest/doctest.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "support/doctest_after_torch.hpp"   // ATen redefines CHECK

#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "troupe/actors/model.hpp"
#include "troupe/rl.hpp"

namespace ta = troupe::actors;
using namespace troupe::rl;

namespace {

// A bigram model: the next token's logits from the current token alone (an embedding and an
// output matrix), with the config's scalar heads on the embedding. It keeps no decode cache, so
// generation passes it the whole prefix at every step.
class Bigram final : public ta::Model {
 public:
  explicit Bigram(const ta::PolicyConfig& c) : Model(c) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(c.seed);
    params_.emplace_back("emb", at::randn({c.vocab_size, c.d_model}, gen).mul_(0.02));
    params_.emplace_back("out", at::randn({c.vocab_size, c.d_model}, gen).mul_(0.02));
    add_scalar_heads(c.d_model, gen);
  }
  at::Tensor forward(const at::Tensor& tokens, const at::Tensor&, const at::Tensor&, ta::DecodeCache* cache,
                     std::int64_t offset) const override {
    if (cache != nullptr || offset != 0) throw std::invalid_argument("Bigram: no cache");
    return at::linear(at::embedding(param(0), tokens), param(1));
  }
  Outputs forward_outputs(const at::Tensor& tokens, const at::Tensor&, const at::Tensor&, bool logits) const override {
    const auto h = at::embedding(param(0), tokens);
    Outputs out;
    if (logits) out.logits = at::linear(h, param(1));
    out.heads = scalar_heads_of(h);
    return out;
  }
};
TROUPE_MODEL("test_bigram", Bigram);

RunConfig bigram_run(const std::string& name) {
  RunConfig c;
  c.task.spec = "addition:1-1";
  c.task.train_size = 90;
  c.task.heldout_size = 10;
  c.model.policy.architecture = "test_bigram";
  c.model.policy.context = 8;
  c.model.policy.d_model = 32;
  c.algo.sft.steps = 20;
  c.algo.steps = 2;
  c.algo.prompts_per_step = 8;
  c.algo.group_size = 4;
  c.run.eval_every = 0;
  c.run.verbose = false;
  c.run.run_dir = (std::filesystem::temp_directory_path() / (name + "-" + std::to_string(::getpid()))).string();
  std::filesystem::remove_all(c.run.run_dir);
  return c;
}

}  // namespace

TEST_CASE("a program's own model architecture (TROUPE_MODEL) is made by name, trained and sampled like the transformer") {
  ta::PolicyConfig pc;
  pc.vocab_size = 8;
  pc.d_model = 16;
  pc.architecture = "test_bigram";
  pc.scalar_heads = {"value"};
  auto model = ta::make_model(pc);
  REQUIRE(dynamic_cast<Bigram*>(model.get()) != nullptr);
  std::vector<std::string> names;
  for (const auto& [name, t] : model->parameters()) names.push_back(name);
  CHECK(names == std::vector<std::string>{"emb", "out", "value_head.weight", "value_head.bias"});
  CHECK(model->parameter_count() == 8 * 16 * 2 + 16 + 1);
  // The base class's weight handling works on it: a trunk without the head loads, the head stays.
  ta::PolicyConfig plain = pc;
  plain.scalar_heads.clear();
  auto trunk = ta::make_model(plain);
  CHECK(model->load_trunk(trunk->views()) == std::vector<std::string>{"value"});
  CHECK(at::equal(model->parameters()[0].second, trunk->parameters()[0].second));

  pc.architecture = "no_such_model";
  try {
    ta::make_model(pc);
    FAIL("an unknown architecture was made");
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    CHECK(what.find("no_such_model") != std::string::npos);
    CHECK(what.find("test_bigram") != std::string::npos);
    CHECK(what.find("transformer") != std::string::npos);
  }

  // The Trainer trains it (SFT on one batch: the loss falls) and the rollout engine samples from it.
  auto task = make_task("addition:1-1");
  const ta::CharTokenizer tok(task->alphabet());
  pc.architecture = "test_bigram";
  pc.vocab_size = tok.vocab_size();
  pc.scalar_heads.clear();
  ta::OptimConfig optim;
  optim.lr = 1e-2;
  ta::Trainer trainer(ta::TrainerConfig{pc, optim, 1});
  const auto data = Dataset::make(*task, 64, 4, 3);
  const auto batch = sft_batch(data.train, tok);
  const double first = trainer.train_step(batch).loss;
  double last = first;
  for (int i = 0; i < 40; ++i) last = trainer.train_step(batch).loss;
  CHECK(last < 0.8 * first);
  ta::RolloutEngine engine(ta::RolloutConfig{pc, 1, true});
  engine.update_weights(trainer.weights());
  const auto samples = engine.generate(ta::GenerateRequest{encode_prompts(data.heldout, tok), 3,
                                                           ta::SamplingParams{1.0f, 1.0f, 3, tok.eos_id(), 5}, {}, 0});
  REQUIRE(samples.responses.size() == 12);
  for (const auto& r : samples.responses)
    for (auto id : r) CHECK((id >= 0 && id < pc.vocab_size));
}

TEST_CASE("GRPO in worker processes and PPO (a critic with a value head) run on a program's own architecture") {
  auto rt = troupe::Runtime::create().value();   // the workers are this binary: TROUPE_MODEL ran there too
  auto grpo = bigram_run("troupe_bigram_grpo");
  grpo.placement.worker_processes = true;
  {
    Run run(rt, grpo);
    const auto sum = run.run();
    CHECK(sum.steps == 2);
    const auto records = read_metrics(sum.metrics_path);
    REQUIRE(records.size() == 2);
    CHECK(records[1].policy_version == records[0].policy_version + 1);
    CHECK(records[0].samples_digest != records[1].samples_digest);
  }
  std::filesystem::remove_all(grpo.run.run_dir);
  auto ppo = bigram_run("troupe_bigram_ppo");
  ppo.algo.name = "ppo";
  {
    Run run(rt, ppo);
    const auto sum = run.run();
    CHECK(sum.steps == 2);
    const auto records = read_metrics(sum.metrics_path);
    REQUIRE(records.size() == 2);
    CHECK(records[1].values.count("value_loss") == 1);   // the critic trained
  }
  std::filesystem::remove_all(ppo.run.run_dir);
}
