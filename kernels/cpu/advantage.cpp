// CPU twin of kernel 2. Groups are small (G is 4..64) and the data tiny, so a plain loop per group
// with fp64 statistics; threads only pay off for very many groups.
#include <cmath>

#include "detail/check.hpp"
#include "detail/parallel.hpp"
#include "troupe/kernels/advantage.hpp"

namespace troupe::kernels {

Status group_advantages(const float* scores, std::int64_t groups, std::int64_t group_size,
                        float* advantages, float* group_mean, float* group_std,
                        const AdvantageOptions& o) {
  TROUPE_KERNELS_RETURN_IF_ERROR(
      detail::check_advantages(scores, groups, group_size, advantages, o));
  const std::int64_t g_size = group_size;
  const double denom = o.unbiased_std ? double(g_size - 1) : double(g_size);
  detail::parallel_for(groups, g_size * 8, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t g = begin; g < end; ++g) {
      const float* s = scores + g * g_size;
      double mean = 0.0;
      for (std::int64_t i = 0; i < g_size; ++i) mean += s[i];
      mean /= double(g_size);
      double ss = 0.0;
      for (std::int64_t i = 0; i < g_size; ++i) ss += (s[i] - mean) * (s[i] - mean);
      const double std_dev = g_size > 1 ? std::sqrt(ss / denom) : 0.0;
      const double inv = o.scale_by_std ? 1.0 / (std_dev + o.epsilon) : 1.0;
      float* a = advantages + g * g_size;
      for (std::int64_t i = 0; i < g_size; ++i) {
        // A group of one has no peer: its advantage is 0 even when epsilon is 0.
        a[i] = g_size > 1 ? float((s[i] - mean) * inv) : 0.0f;
      }
      if (group_mean) group_mean[g] = float(mean);
      if (group_std) group_std[g] = float(std_dev);
    }
  });
  return {};
}

}  // namespace troupe::kernels
