// Per-actor options, set fluently: Options{}.name("trainer").cpus(2).max_restarts(3).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace troupe {

template <class T>
class ActorRef;
class PlacementGroup;

class Options {
 public:
  // A label for logs and errors ("trainer"); default: the type name. Labels read "trainer#7".
  Options& name(std::string n) { name_ = std::move(n); return *this; }
  // In-process actors: run on their own thread (default true). RL actors block in compute, and
  // a detached actor never stalls the shared scheduler; false puts small, non-blocking actors on
  // the runtime's worker pool.
  Options& detached(bool d) { detached_ = d; return *this; }
  // Deadline for each call; 0 (default) takes the runtime's: none in-process, and
  // --troupe-remote-call-timeout-ms (default 120 s) for actors in worker processes.
  Options& call_timeout(std::chrono::milliseconds t) { call_timeout_ = t; return *this; }

  // Run the actor in a worker process started by a node daemon (default: in this process, unless
  // it declares resources or colocation). Calls behave the same either way.
  Options& process(bool p) { process_ = p; return *this; }
  // Resources the actor holds on its node (fixed point: ten cpus(0.1) make one CPU). Declaring
  // any puts the actor in a worker process on a node that has them.
  Options& cpus(double n) { cpus_ = n; return *this; }
  Options& gpus(double n) { gpus_ = n; return *this; }
  // Further resources in text form, e.g. "memory=4G,accel_type:H200=1".
  Options& resources(std::string text) { resources_ = std::move(text); return *this; }
  // Share `other`'s worker process (same node, same address space: tensors pass without a copy).
  template <class U>
  Options& colocate_with(const ActorRef<U>& other) { colocate_with_ = other.id(); return *this; }
  // Place the actor in bundle `index` of `group` (-1: any bundle with room); it holds that
  // bundle's resources. With `colocate`, actors of one bundle share one worker process: how a
  // trainer and a rollout engine swap weights with no copy.
  Options& bundle(const PlacementGroup& group, int index = -1, bool colocate = false);
  // Worker actors: how many times the actor is started again after its process dies (-1: no
  // limit). Its id, and every ActorRef to it, stay valid across restarts.
  Options& max_restarts(int n) { max_restarts_ = n; return *this; }
  // Worker actors: how many times a call in flight when the actor died is sent again to the
  // restarted actor (at-least-once, in submission order); 0: such calls fail with ActorDied.
  Options& max_retries(int n) { max_retries_ = n; return *this; }
  // Worker actors: owned by no driver (Ray's lifetime="detached"). Otherwise an actor goes when
  // the driver that spawned it ends, however it ends (kill -9 included: JOB-1); a detached one
  // runs on until `troupe actor kill ID` or a kill through the head's API.
  Options& lifetime_detached(bool d = true) { lifetime_detached_ = d; return *this; }

  const std::string& name() const { return name_; }
  bool detached() const { return detached_; }
  std::chrono::milliseconds call_timeout() const { return call_timeout_; }
  int max_restarts() const { return max_restarts_; }
  int max_retries() const { return max_retries_; }
  bool lifetime_detached() const { return lifetime_detached_; }
  std::uint64_t colocate_with() const { return colocate_with_; }
  std::uint64_t placement_group() const { return group_; }
  int bundle_index() const { return bundle_index_; }
  bool colocate() const { return colocate_; }
  // "CPU=2,GPU=0.5,..." from cpus, gpus and resources().
  std::string resource_text() const;
  bool needs_process() const {
    return process_ || !resource_text().empty() || colocate_with_ != 0 || group_ != 0;
  }

 private:
  std::string name_;
  bool detached_ = true;
  std::chrono::milliseconds call_timeout_{0};
  bool process_ = false;
  double cpus_ = 0, gpus_ = 0;
  std::string resources_;
  std::uint64_t colocate_with_ = 0;
  std::uint64_t group_ = 0;
  int bundle_index_ = -1;
  bool colocate_ = false;
  int max_restarts_ = 0;
  int max_retries_ = 0;
  bool lifetime_detached_ = false;
};

}  // namespace troupe
