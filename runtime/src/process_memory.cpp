#include "process_memory.hpp"

#include <malloc.h>

#include <cstdlib>
#include <cstring>

namespace troupe::detail {
namespace {

// Whether the environment sets this malloc setting itself: its own variable, or its tunable.
bool environment_sets(const char* variable, const char* tunable) {
  if (std::getenv(variable) != nullptr) return true;
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  return tunables != nullptr && std::strstr(tunables, tunable) != nullptr;
}

}  // namespace

void keep_tensor_memory(bool worker_process) {
  if (worker_process && !environment_sets("MALLOC_ARENA_MAX", "glibc.malloc.arena_max")) ::mallopt(M_ARENA_MAX, 1);
  if (!environment_sets("MALLOC_TRIM_THRESHOLD_", "glibc.malloc.trim_threshold")) ::mallopt(M_TRIM_THRESHOLD, 1 << 30);
  if (!environment_sets("MALLOC_MMAP_THRESHOLD_", "glibc.malloc.mmap_threshold")) ::mallopt(M_MMAP_THRESHOLD, 64 << 20);
  if (!environment_sets("MALLOC_TOP_PAD_", "glibc.malloc.top_pad")) ::mallopt(M_TOP_PAD, 64 << 20);
}

}  // namespace troupe::detail
