#include "troupe/embedded_cluster.hpp"

#include <atomic>

namespace troupe {
namespace {

std::atomic<EmbeddedClusterFactory>& slot() {
  static std::atomic<EmbeddedClusterFactory> factory{nullptr};   // safe from other static initialisers
  return factory;
}

}  // namespace

void set_embedded_cluster_factory(EmbeddedClusterFactory factory) { slot().store(factory); }

EmbeddedClusterFactory embedded_cluster_factory() { return slot().load(); }

}  // namespace troupe
