// Tasks, data sets, the data cursor (RL-2), batch building, metrics and run state.
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "troupe/rl.hpp"

using namespace troupe::rl;

TEST_CASE("addition problems carry their exact sums and respect the digit range") {
  AdditionTask task(1, 2);
  std::mt19937_64 rng(4);
  for (int i = 0; i < 500; ++i) {
    Problem p = task.sample(rng);
    auto plus = p.prompt.find('+');
    REQUIRE(plus != std::string::npos);
    REQUIRE(p.prompt.back() == '=');
    const long a = std::stol(p.prompt.substr(0, plus)), b = std::stol(p.prompt.substr(plus + 1));
    CHECK(std::to_string(a + b) == p.answer);
    CHECK((a >= 0 && a <= 99 && b >= 0 && b <= 99));
  }
  CHECK_THROWS_AS(AdditionTask(0, 2), std::invalid_argument);
  CHECK_THROWS_AS(make_task("subtraction:1-2"), std::invalid_argument);
  CHECK(make_task("addition:2-3")->max_answer_chars() == 4);
  for (const char* bad : {"addition:1-3x", "addition:1-", "addition:-3", "addition:1-99999999999", "addition:1+3", "addition:"})
    CHECK_THROWS_AS(make_task(bad), std::invalid_argument);
}

TEST_CASE("train and held-out sets are disjoint and reproducible from the seed") {
  AdditionTask task(1, 2);
  auto a = Dataset::make(task, 2000, 300, 9), b = Dataset::make(task, 2000, 300, 9);
  std::set<std::string> held;
  for (auto& p : a.heldout) held.insert(p.prompt);
  CHECK(held.size() == 300);
  for (auto& p : a.train) CHECK(held.count(p.prompt) == 0);
  REQUIRE(a.train.size() == b.train.size());
  for (std::size_t i = 0; i < a.train.size(); ++i) CHECK(a.train[i].prompt == b.train[i].prompt);
}

TEST_CASE("a held-out set takes at most its share of each kind of problem, so every kind stays in training") {
  AdditionTask task(1, 2);
  CHECK(task.kind(Problem{"7+85=", "92"}) == "1+2");
  CHECK(task.kind(Problem{"47+85=", "132"}) == "2+2");
  CHECK(task.kind_size("1+1") == 100);
  CHECK(task.kind_size("1+2") == 900);
  CHECK(task.kind_size("2+2") == 8100);
  CHECK(task.kind_size("nonsense") == 0);
  auto kinds = [&](const std::vector<Problem>& set) {
    std::map<std::string, std::set<std::string>> k;
    for (auto& p : set) k[task.kind(p)].insert(p.prompt);
    return k;
  };
  // Unbounded (the draws of before): 500 distinct draws take most one-digit sums out of training.
  const auto open = Dataset::make(task, 20000, 500, 2, 1.0);
  CHECK(kinds(open.heldout)["1+1"].size() > 50);
  CHECK(kinds(open.train)["1+1"].size() < 50);
  // Bounded at 20 %: at most 20 of the 100 one-digit sums are held out, the other 80 are trained on.
  const auto fair = Dataset::make(task, 20000, 500, 2, 0.2);
  CHECK(fair.heldout.size() == 500);
  auto held = kinds(fair.heldout), train = kinds(fair.train);
  CHECK(held["1+1"].size() == 20);
  CHECK(train["1+1"].size() == 80);
  for (auto& [k, prompts] : held) {
    CHECK(double(prompts.size()) <= 0.2 * task.kind_size(k));
    for (auto& p : prompts) CHECK(train[k].count(p) == 0);
  }
  CHECK_THROWS_AS(Dataset::make(task, 100, 10, 2, 0.0), std::invalid_argument);
}

TEST_CASE("the data cursor visits each problem once per epoch and a restored cursor continues exactly (RL-2)") {
  std::vector<Problem> set;
  for (int i = 0; i < 10; ++i) set.push_back({std::to_string(i), ""});
  DataCursor c{77, 0, 0};
  std::multiset<std::string> epoch0;
  for (auto& p : c.next(set, 4)) epoch0.insert(p.prompt);
  for (auto& p : c.next(set, 4)) epoch0.insert(p.prompt);
  DataCursor saved = c;   // mid-epoch: 8 of 10 served
  auto rest = c.next(set, 4);  // 2 from epoch 0, 2 from epoch 1
  for (int i = 0; i < 2; ++i) epoch0.insert(rest[i].prompt);
  CHECK(std::set<std::string>(epoch0.begin(), epoch0.end()).size() == 10);
  CHECK(epoch0.size() == 10);
  CHECK(c.epoch == 1);
  CHECK(c.index == 2);
  auto again = saved.next(set, 4);
  for (int i = 0; i < 4; ++i) CHECK(again[i].prompt == rest[i].prompt);
  // A cursor restored over a smaller set (a resume with other task keys) is refused, not read past the end.
  DataCursor past{77, 0, 12};
  CHECK_THROWS_AS(past.next(set, 1), std::invalid_argument);
  CHECK(past.next(set, 0).empty());
  CHECK_THROWS_AS(DataCursor{}.next({}, 1), std::invalid_argument);
}

TEST_CASE("the newest checkpoint is the highest step by number, and a run state keeps its data key") {
  const auto dir = std::filesystem::temp_directory_path() / ("troupe_ckpt_order-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  RunState s;
  s.data = "addition:1-2 train 10";
  for (std::int64_t step : {999999, 1000000, 12}) {
    const auto d = checkpoint_dir(dir.string(), step);
    std::filesystem::create_directories(d);
    s.step = step;
    save_run_state(d, s);
  }
  const auto staging = dir / "checkpoints" / "step-2000000.tmp";   // written whole, not yet renamed: never the newest
  std::filesystem::create_directories(staging);
  s.step = 2000000;
  save_run_state(staging.string(), s);
  const auto newest = latest_checkpoint(dir.string());
  REQUIRE(newest.has_value());
  CHECK(std::filesystem::path(*newest).filename() == "step-1000000");
  const RunState back = load_run_state(*newest);
  CHECK(back.step == 1000000);
  CHECK(back.data == s.data);
  std::filesystem::remove_all(dir);
}

TEST_CASE("an SFT batch is the left-padded prompt, then the answer and eos, with the loss on the answer") {
  troupe::actors::CharTokenizer tok("0123456789+=");
  auto b = sft_batch({{"1+2=", "3"}, {"10+20=", "30"}}, tok);
  REQUIRE(b.tokens.shape == std::vector<std::int64_t>({2, 9}));
  const auto* t = b.tokens.data_as<std::int64_t>();
  const auto* attn = b.attn_mask.data_as<bool>();
  const auto* loss = b.loss_mask.data_as<bool>();
  // Row 0: 2 pads, "1+2=", "3", eos, 1 pad.
  CHECK_FALSE(attn[0]);
  CHECK_FALSE(attn[1]);
  CHECK(t[2] == tok.encode("1")[0]);
  CHECK(t[6] == tok.encode("3")[0]);
  CHECK(t[7] == tok.eos_id());
  CHECK((loss[6] && loss[7] && !loss[5] && !loss[8] && !attn[8]));
  // Row 1: no pad; loss on "30" + eos.
  CHECK((attn[9] && loss[9 + 6] && loss[9 + 7] && loss[9 + 8] && !loss[9 + 5]));
}

TEST_CASE("metrics lines round-trip and a resumed log drops the steps after its checkpoint") {
  const auto dir = std::filesystem::temp_directory_path() / ("troupe_metrics_test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto path = (dir / "m.jsonl").string();
  {
    MetricsLog log(path);
    for (int s = 1; s <= 5; ++s) {
      StepRecord r;
      r.step = s;
      r.reward_mean = 0.1 * s;
      if (s == 4) {
        r.heldout_acc = 0.5;
        r.heldout_acc_by_kind = {{"1+1", 0.75}, {"2+2", 0.25}};
      }
      log.write(r);
    }
  }
  MetricsLog resumed(path, 4);
  auto records = read_metrics(path);
  REQUIRE(records.size() == 4);
  CHECK(records[3].heldout_acc.value_or(-1) == doctest::Approx(0.5));
  CHECK(records[3].heldout_acc_by_kind == std::map<std::string, double>{{"1+1", 0.75}, {"2+2", 0.25}});
  CHECK(records[2].reward_mean == doctest::Approx(0.3));
  CHECK_FALSE(records[2].heldout_acc.has_value());
  CHECK(records[2].heldout_acc_by_kind.empty());
  resumed.write([] { StepRecord r; r.step = 5; return r; }());
  // A torn last line (its process died while writing it) is dropped on resume; a bad line before
  // the last is a damaged file, refused by line.
  { std::ofstream(path, std::ios::app) << "{\"step\": 6, \"rewa"; }
  { MetricsLog again(path, 5); }
  CHECK(read_metrics(path).size() == 5);
  { std::ofstream(path, std::ios::app) << "not json\n{\"step\": 6}\n"; }
  try {
    MetricsLog damaged(path, 6);
    FAIL("a damaged metrics file was taken");
  } catch (const std::runtime_error& e) {
    CHECK(std::string(e.what()).find("line 6") != std::string::npos);
  }
  std::ifstream in(path);   // refused before anything was rewritten: all 7 lines still there
  int lines = 0;
  for (std::string line; std::getline(in, line);) ++lines;
  CHECK(lines == 7);
  std::filesystem::remove_all(dir);
}

TEST_CASE("run state survives a round trip through state.json") {
  const auto dir = (std::filesystem::temp_directory_path() / ("troupe_state_test-" + std::to_string(::getpid()))).string();
  std::filesystem::create_directories(dir);
  RunState s;
  s.step = 12;
  s.policy_version = 312;
  s.seed = 0xfeedfacecafebeefull;
  s.cursor = DataCursor{5, 2, 17};
  s.sft_heldout_acc = 0.25;
  s.sft_heldout_acc_by_kind = {{"1+2", 0.5}};
  s.sft_steps = 848;
  save_run_state(dir, s);
  RunState r = load_run_state(dir);
  CHECK(r.step == 12);
  CHECK(r.policy_version == 312);
  CHECK(r.seed == s.seed);
  CHECK((r.cursor.seed == 5 && r.cursor.epoch == 2 && r.cursor.index == 17));
  CHECK(r.sft_heldout_acc == 0.25);
  CHECK(r.sft_heldout_acc_by_kind == s.sft_heldout_acc_by_kind);
  CHECK(r.sft_steps == 848);
  std::filesystem::remove_all(dir);
  CHECK_THROWS(load_run_state(dir));
}

TEST_CASE("DPO pairs: per prompt its first correct sample against its first wrong one, prompts without both left out") {
  using troupe::actors::RewardResult;
  const RewardResult right{1.0f, true, true}, wrong{0.1f, true, false}, malformed{0.0f, false, false};
  // Prompt 0 (rows 0-2): wrong, right, right -> (1, 0). Prompt 1: all right -> none. Prompt 2
  // (rows 6-8): malformed, right, wrong -> (7, 8): a well-formed wrong answer before a malformed
  // one. Prompt 3 (rows 9-11): malformed, right, malformed -> (10, 9).
  const std::vector<RewardResult> r{wrong, right, right, right, right, right, malformed, right, wrong,
                                    malformed, right, malformed};
  CHECK(preference_pairs(r, 3) == std::vector<std::int64_t>{1, 0, 7, 8, 10, 9});
  CHECK(preference_pairs({}, 4).empty());
  CHECK_THROWS_AS(preference_pairs(r, 5), std::invalid_argument);
}

TEST_CASE("a DPO batch holds the pairs' rows in order, their reference log-likelihoods, and never splits a pair") {
  // Three rows of 4 tokens; the response is the last two tokens of each row.
  troupe::actors::RolloutBatch rollout;
  rollout.tokens = troupe::TensorView::empty(troupe::DType::I64, {3, 4});
  rollout.attn_mask = troupe::TensorView::empty(troupe::DType::Bool, {3, 4});
  rollout.response_mask = troupe::TensorView::empty(troupe::DType::Bool, {3, 4});
  auto ref = troupe::TensorView::empty(troupe::DType::F32, {3, 4});
  for (int i = 0; i < 12; ++i) {
    rollout.tokens.data_as<std::int64_t>()[i] = 100 + i;
    rollout.attn_mask.data_as<bool>()[i] = true;
    rollout.response_mask.data_as<bool>()[i] = i % 4 >= 2;
    ref.data_as<float>()[i] = -float(i);   // row r's response: -(4r + 2) - (4r + 3)
  }
  auto b = dpo_batch(rollout, {2, 0}, 0.1, false, 2);
  CHECK(b.inputs.count("ref_seq_logp") == 0);   // the reference has not scored the rows yet
  auto ref_rows = troupe::TensorView::empty(troupe::DType::F32, {2, 4});   // its logprobs of rows 2 and 0
  std::copy_n(ref.data_as<float>() + 8, 4, ref_rows.data_as<float>());
  std::copy_n(ref.data_as<float>(), 4, ref_rows.data_as<float>() + 4);
  add_reference_logprobs(b, ref_rows);
  CHECK(b.objective == "dpo");
  CHECK(b.row_group == 2);
  CHECK(b.micro_batches == 2);
  REQUIRE(b.tokens.shape == std::vector<std::int64_t>{2, 4});
  CHECK(b.tokens.data_as<std::int64_t>()[0] == 108);   // row 2 first: the chosen
  CHECK(b.tokens.data_as<std::int64_t>()[4] == 100);
  const auto& seq = b.inputs.at("ref_seq_logp");
  CHECK(seq.data_as<float>()[0] == doctest::Approx(-21.0));
  CHECK(seq.data_as<float>()[1] == doctest::Approx(-5.0));
  CHECK(b.options.at("beta") == doctest::Approx(0.1));
  CHECK(b.options.at("ipo") == 0.0);
  CHECK_THROWS_AS(dpo_batch(rollout, {2}, 0.1, false), std::invalid_argument);      // half a pair
  CHECK_THROWS_AS(dpo_batch(rollout, {2, 3}, 0.1, false), std::invalid_argument);   // no row 3
  CHECK_THROWS_AS(add_reference_logprobs(b, ref), std::invalid_argument);           // 3 rows' logprobs for 2 rows
}

TEST_CASE("the Trainer takes a DPO batch: one step with the dpo objective reports its metrics") {
  troupe::actors::RolloutBatch rollout;   // 4 rows of 5 tokens, responses on the last 2
  rollout.tokens = troupe::TensorView::empty(troupe::DType::I64, {4, 5});
  rollout.attn_mask = troupe::TensorView::empty(troupe::DType::Bool, {4, 5});
  rollout.response_mask = troupe::TensorView::empty(troupe::DType::Bool, {4, 5});
  auto ref = troupe::TensorView::empty(troupe::DType::F32, {4, 5});
  for (int i = 0; i < 20; ++i) {
    rollout.tokens.data_as<std::int64_t>()[i] = 1 + (i * 3) % 6;
    rollout.attn_mask.data_as<bool>()[i] = true;
    rollout.response_mask.data_as<bool>()[i] = i % 5 >= 3;
    ref.data_as<float>()[i] = i % 5 >= 3 ? -2.0f : 0.0f;
  }
  troupe::actors::PolicyConfig policy;
  policy.vocab_size = 8;
  policy.context = 8;
  policy.layers = 1;
  policy.d_model = 16;
  policy.heads = 2;
  troupe::actors::Trainer trainer(troupe::actors::TrainerConfig{policy, troupe::actors::OptimConfig{}, 1});
  auto batch = dpo_batch(rollout, {0, 1, 3, 2}, 0.1, false, 2);
  add_reference_logprobs(batch, ref);   // every row's reference logprob is -2 a response token: any order of them
  auto m = trainer.train_step(batch);
  CHECK(m.policy_version == 1);
  CHECK(std::isfinite(m.loss));
  CHECK(m.values.count("reward_accuracy") == 1);
  CHECK(m.values.count("reward_margin") == 1);
}

TEST_CASE("reward-model pairs: the correct answer against wrong, well-formed samples, and a batch of them trains a score head") {
  using troupe::actors::RewardResult;
  const troupe::actors::CharTokenizer tok("0123456789+=");
  const std::vector<Problem> problems{{"1+2=", "3"}, {"2+2=", "4"}, {"5+4=", "9"}};
  troupe::actors::RolloutBatch samples;
  samples.responses = {tok.encode("3"), tok.encode("5"), tok.encode("4"), tok.encode("4"), tok.encode("+"), tok.encode("8")};
  const RewardResult right{1.0f, true, true}, wrong{0.0f, true, false}, malformed{0.0f, false, false};
  // Prompt 0: right, wrong("5") -> a pair. Prompt 1: right, right -> none. Prompt 2: malformed, wrong("8").
  const auto pairs = reward_model_pairs(problems, 2, samples, {right, wrong, right, right, malformed, wrong}, tok);
  REQUIRE(pairs.size() == 2);
  CHECK(pairs[0].chosen == "3");
  CHECK(pairs[0].rejected == "5");
  CHECK(pairs[1].problem.prompt == "5+4=");
  CHECK(pairs[1].rejected == "8");
  CHECK_THROWS_AS(reward_model_pairs(problems, 3, samples, {right, wrong}, tok), std::invalid_argument);
  // Up to two distinct wrong answers per prompt: prompt 0 of three samples "5", "5", "6".
  troupe::actors::RolloutBatch three;
  three.responses = {tok.encode("5"), tok.encode("5"), tok.encode("6")};
  const auto two = reward_model_pairs({problems[0]}, 3, three, {wrong, wrong, wrong}, tok, 2);
  REQUIRE(two.size() == 2);
  CHECK(two[1].rejected == "6");

  const auto b = reward_model_batch(pairs, tok, 0.5);
  CHECK(b.objective == "bradley_terry");
  CHECK(b.row_group == 2);
  CHECK(b.options.at("margin") == 0.5);
  REQUIRE(b.tokens.shape[0] == 4);   // chosen, rejected, chosen, rejected

  // The Trainer trains a model with a score head on them; a RewardModel loading its weights ranks
  // every pair the right way round.
  troupe::actors::PolicyConfig model;
  model.vocab_size = tok.vocab_size();
  model.context = 8;
  model.layers = 1;
  model.d_model = 16;
  model.heads = 2;
  model.scalar_heads = {"score"};
  troupe::actors::OptimConfig optim;
  optim.lr = 1e-2;
  troupe::actors::Trainer trainer(troupe::actors::TrainerConfig{model, optim, 1});
  double acc = 0;
  for (int i = 0; i < 40; ++i) acc = trainer.train_step(reward_model_batch(pairs, tok)).values.at("pair_accuracy");
  CHECK(acc == 1.0);
  char path[] = "/tmp/troupe-rm-XXXXXX";
  REQUIRE(::mkdtemp(path) != nullptr);
  const std::string file = std::string(path) + "/rm.safetensors";
  trainer.save_weights(file);
  troupe::actors::RewardModel scorer(troupe::actors::RewardModelConfig{model, file, 1});
  const auto scores = scorer.score(troupe::actors::SequenceBatch{b.tokens, b.attn_mask});
  REQUIRE(scores.size() == 4);
  CHECK(scores[0] > scores[1]);
  CHECK(scores[2] > scores[3]);
  // A critic started from it (PPO's --set algo.critic_init=PATH): its trunk, its score head as the value head.
  troupe::actors::PolicyConfig critic = model;
  critic.scalar_heads = {"value"};
  troupe::actors::Trainer from_rm(troupe::actors::TrainerConfig{critic, optim, 1});
  CHECK(from_rm.load_trunk_as(file, "score", "value").empty());
  const auto rm_weights = trainer.weights(), critic_weights = from_rm.weights();
  REQUIRE(rm_weights.names.size() == critic_weights.names.size());
  for (std::size_t i = 0; i < rm_weights.names.size(); ++i) {
    CHECK(critic_weights.names[i] == (rm_weights.names[i].rfind("score_head.", 0) == 0 ? "value" + rm_weights.names[i].substr(5)
                                                                                       : rm_weights.names[i]));
    CHECK(std::memcmp(rm_weights.tensors[i].data, critic_weights.tensors[i].data, rm_weights.tensors[i].nbytes()) == 0);
  }
  CHECK_THROWS_AS(from_rm.load_trunk_as(file, "value", "value"), std::invalid_argument);   // the file has no value head
  std::filesystem::remove_all(path);
  // A model without a score head cannot be a reward model.
  model.scalar_heads.clear();
  CHECK_THROWS_AS(troupe::actors::RewardModel(troupe::actors::RewardModelConfig{model, "", 1}), std::invalid_argument);
}
