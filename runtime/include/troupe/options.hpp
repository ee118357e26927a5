// Per-actor options, set fluently: Options{}.name("trainer").call_timeout(std::chrono::seconds(30)).
#pragma once

#include <chrono>
#include <string>

namespace troupe {

class Options {
 public:
  // A label for logs and errors ("trainer"); default: the type name and actor id.
  Options& name(std::string n) { name_ = std::move(n); return *this; }
  // Run the actor on its own thread (default true): RL actors block in compute, and a detached
  // actor never stalls the shared scheduler. false runs it on the runtime's worker pool, which
  // suits many small, non-blocking actors.
  Options& detached(bool d) { detached_ = d; return *this; }
  // Deadline for each call to this actor; 0 (the default) takes the runtime's call timeout,
  // whose own default is none in-process.
  Options& call_timeout(std::chrono::milliseconds t) { call_timeout_ = t; return *this; }

  const std::string& name() const { return name_; }
  bool detached() const { return detached_; }
  std::chrono::milliseconds call_timeout() const { return call_timeout_; }

 private:
  std::string name_;
  bool detached_ = true;
  std::chrono::milliseconds call_timeout_{0};
};

}  // namespace troupe
