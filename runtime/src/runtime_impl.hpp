// The process's runtime: its CAF actor system, the deadline timer and the table of live actors.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>

#include "actor_cell.hpp"
#include "deadline_timer.hpp"
#include "troupe/runtime.hpp"

namespace troupe::detail {

class RuntimeImpl {
 public:
  explicit RuntimeImpl(RuntimeConfig config);
  ~RuntimeImpl();   // shutdown()

  std::shared_ptr<ActorCell> spawn(const ActorTypeInfo& type, Factory factory, Payload ctor_args,
                                   const Options& opts);
  void kill(const std::shared_ptr<ActorCell>& cell);
  std::shared_ptr<ActorCell> find(std::uint64_t id) const;
  void shutdown();

  const RuntimeConfig& config() const { return config_; }

 private:
  static caf::actor_system_config& configure(caf::actor_system_config& cfg, const RuntimeConfig& rc);

  RuntimeConfig config_;
  caf::actor_system_config caf_config_;
  std::unique_ptr<caf::actor_system> system_;
  DeadlineTimer timer_;
  mutable std::mutex mu_;
  bool shut_down_ = false;
  std::unordered_map<std::uint64_t, std::shared_ptr<ActorCell>> cells_;
  std::atomic<std::uint64_t> next_id_{1};
};

}  // namespace troupe::detail
