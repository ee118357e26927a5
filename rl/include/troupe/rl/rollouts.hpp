// The rollout engines of a run: engine 0, colocated with the trainer (weights by reference), and an
// elastic group of more engines that join and leave while the run goes on (each pulls every new
// version from the weight store: the mapped file on the same host, the chain across hosts).
//
//   RolloutPool pool(rt, engine0, store, RolloutRange{1, 3}, member_options, engine_config);
//   pool.pull_weights(version);                  // after the trainer published `version`
//   auto batch = pool.generate(request, &used);  // split by cost over this epoch's engines
//
// A step's prompts are split across engine 0 and the group's current members by expected cost
// (tokens) with the placement balancer; each part carries its prompts' places in the whole batch
// and the batch's prompt width, so the merged batch is token for token the one a single engine
// gives (generate.hpp): the number of engines changes the speed, never the math. A member that
// dies mid-step loses no prompt: its part is re-sent to another member (`.retryable()`), and to
// engine 0 when no member is left.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "troupe/actors/rollout_engine.hpp"
#include "troupe/elastic.hpp"
#include "troupe/weight_store.hpp"

namespace troupe::rl {

// How many engines a run samples with, engine 0 included: 1 <= min <= max.
struct RolloutRange {
  int min = 1, max = 1;
  // "MIN:MAX" (or "N" for N:N). Throws std::invalid_argument naming the text.
  static RolloutRange parse(const std::string& text);
};

class RolloutPool {
 public:
  // Starts the group of range.max - 1 engines (each with `member` options, e.g. its own worker
  // process and CPUs) when range.max > 1, and waits up to `wait` for range.min - 1 of them.
  RolloutPool(Runtime& rt, ActorRef<actors::RolloutEngine> engine0, ActorRef<WeightStore> store, RolloutRange range,
              const Options& member, const actors::RolloutConfig& config,
              std::chrono::milliseconds wait = std::chrono::seconds(60));
  ~RolloutPool();   // removes the group
  RolloutPool(const RolloutPool&) = delete;
  RolloutPool& operator=(const RolloutPool&) = delete;

  // Every engine pulls the store's latest version, `version` (the trainer's, just published). A
  // member that left meanwhile is skipped; one that joins later pulls the latest in its on_join.
  // Engine 0's pull is waited for here when engine 0 is in this process. In another process it is
  // only sent: engine 0's next call (generate, or settle()'s wait) queues behind it, the two leave
  // in one write and run in order, and that call takes the pull's reply too, a round trip fewer a
  // step; a failed pull (or one that got another version) is thrown there.
  void pull_weights(std::int64_t version);
  // Waits for engine 0's outstanding pull, if any: before a call to engine 0 made outside the pool.
  void settle();
  // The whole request sampled across the engines (its prompts left-padded to whole.prompt_width,
  // or to its longest prompt when that is 0); *engines receives how many took part.
  actors::RolloutBatch generate(const actors::GenerateRequest& whole, int* engines = nullptr);
  std::size_t members() const;   // the group's members in this epoch (engine 0 not counted)

 private:
  void check_pulled(std::int64_t got) const;   // throws unless engine 0 got version_

  ActorRef<actors::RolloutEngine> engine0_;
  ActorRef<WeightStore> store_;
  std::optional<ElasticGroup<actors::RolloutEngine>> group_;
  bool published_ = false;   // a version exists for on_join to pull
  std::int64_t version_ = 0;   // the last pull_weights's
  Future<std::int64_t> pulling_;   // engine 0's pull not yet waited for (it is in another process)
};

}  // namespace troupe::rl
