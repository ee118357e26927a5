// CPU twin of kernel 6: rows are independent, each a sequential reverse scan (detail::gae_row);
// threads split the rows once there is enough work.
#include "detail/check.hpp"
#include "detail/formulas.hpp"
#include "detail/parallel.hpp"
#include "troupe/kernels/gae.hpp"

namespace troupe::kernels {

Status gae(const float* rewards, const float* values, const std::uint8_t* mask, std::int64_t rows,
           std::int64_t tokens, float* advantages, float* returns, const GaeOptions& o) {
  TROUPE_RETURN_IF_ERROR(detail::check_gae(rewards, values, rows, tokens, advantages, returns, o));
  if (tokens == 0) return {};
  const double gamma = o.gamma, gamma_lambda = double(o.gamma) * double(o.lambda);
  detail::parallel_for(rows, tokens * 17, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t row = begin; row < end; ++row) {
      const std::int64_t at = row * tokens;
      detail::gae_row(rewards + at, values + at, mask ? mask + at : nullptr, tokens, gamma, gamma_lambda,
                      advantages + at, returns + at);
    }
  });
  return {};
}

}  // namespace troupe::kernels
