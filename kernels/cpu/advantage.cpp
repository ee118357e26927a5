// CPU twin of kernel 2. Groups are small (G is 4..64) and the data tiny, so a plain loop per group
// with fp64 statistics; threads only pay off for very many groups.
#include <cmath>

#include "detail/check.hpp"
#include "detail/formulas.hpp"
#include "detail/parallel.hpp"
#include "troupe/kernels/advantage.hpp"

namespace troupe::kernels {

Status group_advantages(const float* scores, std::int64_t groups, std::int64_t group_size,
                        float* advantages, float* group_mean, float* group_std,
                        const AdvantageOptions& o) {
  TROUPE_RETURN_IF_ERROR(
      detail::check_advantages(scores, groups, group_size, advantages, o));
  const std::int64_t g_size = group_size;
  const double denom = o.unbiased_std ? double(g_size - 1) : double(g_size);
  detail::parallel_for(groups, g_size * 8, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t g = begin; g < end; ++g) {
      double mean, std_dev;
      detail::group_advantage(scores + g * g_size, g_size, denom, float(o.epsilon), o.scale_by_std,
                              advantages + g * g_size, &mean, &std_dev);
      if (group_mean) group_mean[g] = float(mean);
      if (group_std) group_std[g] = float(std_dev);
    }
  });
  return {};
}

}  // namespace troupe::kernels
