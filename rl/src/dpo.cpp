// DPO (Rafailov et al. 2023, arXiv:2305.18290) on a policy's own samples, in rounds. Every
// dpo_round_steps steps, the current policy samples the prompts of the round's steps; a prompt with
// a correct and a wrong answer gives a pair (preference_pairs), and the reference scores the pairs'
// rows (those only) once, there. Each step of the round then minimises
//   -log sigmoid(beta * ((log pi(y_w) - log pi_ref(y_w)) - (log pi(y_l) - log pi_ref(y_l))))
// over its prompts' pairs (updates_per_batch optimizer steps; IPO's squared loss with dpo_ipo).
// Round length 1 is online DPO (each step's own samples); round length = steps is offline DPO (every
// pair from the SFT policy). The round's samples not yet trained on are checkpointed
// (dpo_round.safetensors), so a resumed run replays them.
#include <algorithm>
#include <cmath>
#include <deque>
#include <filesystem>
#include <stdexcept>

#include "builtin_algorithms.hpp"
#include "troupe/actors/safetensors.hpp"
#include "troupe/codec.hpp"
#include "troupe/rl/batches.hpp"

namespace troupe::rl {
namespace {

// One step's share of a round, sampled at the round's start.
struct RoundStep {
  actors::RolloutBatch samples;
  std::vector<actors::RewardResult> rewards;
  std::int64_t pairs = 0;
  actors::TrainBatch batch;   // dpo_batch of the pairs (unused when there is none)
  MSGPACK_DEFINE(samples, rewards, pairs, batch);
};

const char* const kRoundFile = "dpo_round.safetensors";

class Dpo final : public Algorithm {
 public:
  explicit Dpo(const RunConfig& c) {
    if (c.algo.dpo_round_steps < 1) throw std::invalid_argument("dpo: dpo_round_steps must be at least 1");
    if (!(c.algo.dpo_beta > 0) || !std::isfinite(c.algo.dpo_beta)) throw std::invalid_argument("dpo: algo.dpo_beta must be > 0");
    // Pairs are a prompt's correct answer against a wrong one (the verifier's verdicts): a reward
    // backend's scores would be computed and train nothing.
    if (c.algo.reward != "rule")
      throw std::invalid_argument("dpo: algo.reward '" + c.algo.reward + "': DPO's pairs come from the task's verifier (rule)");
  }

  StepRecord step(Run& run) override {
    StepClock clock;
    if (round_.empty()) sample_round(run, clock);   // new pairs from the current policy
    RoundStep s = std::move(round_.front());
    round_.pop_front();
    actors::TrainMetrics m;
    m.policy_version = run.state().policy_version;   // a step without a pair changes nothing
    if (s.pairs > 0) {
      for (std::int32_t i = 0; i < std::max(1, run.config().algo.updates_per_batch); ++i) m = run.train(s.batch);
      m.values["pairs"] = double(s.pairs);
    }
    clock.lap(&StepTimes::train);
    run.sync_weights();
    clock.lap(&StepTimes::sync);
    return run.record(s.samples, s.rewards, m, clock);
  }

  void save(Run&, const std::string& dir) override {
    if (round_.empty()) return;
    const Payload p = encode_value(std::vector<RoundStep>(round_.begin(), round_.end()));
    actors::NamedTensors named;
    TensorView bytes = TensorView::empty(DType::U8, {std::int64_t(p.bytes.size())});
    std::copy(p.bytes.begin(), p.bytes.end(), bytes.data_as<char>());
    named.emplace_back("round", bytes);
    for (std::size_t i = 0; i < p.tensors.size(); ++i) {   // a step without pairs has an empty batch: its views hold no data
      const TensorView& t = p.tensors[i];
      named.emplace_back("t" + std::to_string(i), t.data != nullptr ? t : TensorView::empty(DType::U8, {0}));
    }
    actors::write_safetensors(dir + "/" + kRoundFile, named);
  }

  void load(Run&, const std::string& dir) override {
    round_.clear();
    const std::string path = dir + "/" + kRoundFile;
    if (!std::filesystem::exists(path)) return;   // the checkpoint ended a round
    const auto file = actors::read_safetensors(path);
    const TensorView* bytes = file.find("round");
    if (bytes == nullptr) throw std::runtime_error(path + ": no 'round' tensor");
    Payload p;
    p.bytes.assign(bytes->data_as<const char>(), bytes->data_as<const char>() + bytes->nbytes());
    // By name, t0, t1, ...: a step without pairs saved empty tensors at one offset, whose order in
    // the file's table is not fixed.
    for (const TensorView* t; (t = file.find("t" + std::to_string(p.tensors.size()))) != nullptr;) p.tensors.push_back(*t);
    if (file.tensors.size() != p.tensors.size() + 1) throw std::runtime_error(path + ": tensors other than round, t0, t1, ...");
    for (auto& s : decode_value<std::vector<RoundStep>>(p)) round_.push_back(std::move(s));
  }

 private:
  // The next min(dpo_round_steps, steps left) steps' samples, each drawn as its own step would
  // draw it (its prompts, its step's seed), scored and paired, with the reference's logprobs.
  void sample_round(Run& run, StepClock& clock) {
    const RunConfig& c = run.config();
    const std::int64_t k = std::max<std::int64_t>(1, std::min<std::int64_t>(c.algo.dpo_round_steps, c.algo.steps - run.state().step));
    for (std::int64_t i = 0; i < k; ++i) {
      const auto prompts = run.next_prompts();
      RoundStep s;
      s.samples = run.generate(prompts, run.state().step + i);
      clock.lap(&StepTimes::rollout);
      s.rewards = run.score(prompts, s.samples);
      clock.lap(&StepTimes::reward);
      const auto pairs = preference_pairs(s.rewards, c.algo.group_size);   // chosen, rejected, pair after pair
      s.pairs = std::int64_t(pairs.size() / 2);
      if (s.pairs > 0) {   // the pairs' rows, chosen then rejected; the reference scores those only
        s.batch = dpo_batch(s.samples, pairs, c.algo.dpo_beta, c.algo.dpo_ipo, c.algo.micro_batches);
        // At the batch's temperature (1: DPO's log pi(y|x) is the model's own), not the sampling one.
        add_reference_logprobs(s.batch, run.reference_logprobs(s.batch.tokens, s.batch.attn_mask, s.batch.temperature));
      }
      clock.lap(&StepTimes::reference);
      round_.push_back(std::move(s));
    }
  }

  std::deque<RoundStep> round_;
};

}  // namespace

std::unique_ptr<Algorithm> detail::make_dpo(const RunConfig& config) { return std::make_unique<Dpo>(config); }

}  // namespace troupe::rl
