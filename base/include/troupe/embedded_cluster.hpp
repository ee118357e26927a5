// The embedded cluster: a head and a node daemon inside a driver that runs without `--address`,
// so that actors which need a worker process work in a single program. The runtime asks for one
// through this interface and never includes control/, which implements it; a program gets that
// implementation by linking troupe::troupe (every program does: any may need one).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace troupe {

class EmbeddedCluster {
 public:
  virtual ~EmbeddedCluster() = default;
  virtual std::string host() const = 0;          // where the head listens, "127.0.0.1"
  virtual std::uint16_t port() const = 0;
  virtual const std::string& token() const = 0;  // the cluster token it made
  virtual const std::string& session_dir() const = 0;
  // Stops the node (and with it every worker process), then the head. Idempotent.
  virtual void stop() = 0;
};

struct EmbeddedClusterSpec {
  std::string session_root;   // the session directory goes under it (TROUPE_TMPDIR)
};

// Starts one; throws std::runtime_error naming what failed.
using EmbeddedClusterFactory = std::unique_ptr<EmbeddedCluster> (*)(const EmbeddedClusterSpec&);

// Set once, at static initialisation, by the library that implements it. Thread-safe.
void set_embedded_cluster_factory(EmbeddedClusterFactory factory);
EmbeddedClusterFactory embedded_cluster_factory();   // null when the program links none

}  // namespace troupe
