#include "gpu_pool.hpp"

#include <algorithm>
#include <functional>

namespace troupe::placement::detail {
namespace {
constexpr std::int64_t kOne = Quantity::kScale;
}

GpuPool GpuPool::for_node(Quantity total) {
  GpuPool pool;
  const std::int64_t units = std::max<std::int64_t>(total.units(), 0);
  int index = 0;
  for (std::int64_t left = units; left > 0; left -= kOne) pool.slots_.push_back({index++, std::min(left, kOne)});
  return pool;
}

GpuPool GpuPool::from_shares(const std::vector<GpuShare>& shares) {
  GpuPool pool;
  for (const GpuShare& s : shares) pool.slots_.push_back({s.index, s.amount.units()});
  return pool;
}

int GpuPool::best_fit(std::int64_t units) const {
  int best = -1;
  for (int i = 0; i < static_cast<int>(slots_.size()); ++i)
    if (slots_[i].free >= units && (best < 0 || slots_[i].free < slots_[best].free)) best = i;
  return best;
}

bool GpuPool::can_take(Quantity amount) const {
  const std::int64_t units = amount.units();
  if (units <= 0) return true;
  if (units < kOne) return best_fit(units) >= 0;
  const auto whole = std::count_if(slots_.begin(), slots_.end(), [](const Slot& s) { return s.free == kOne; });
  return units % kOne == 0 && whole >= units / kOne;
}

bool GpuPool::can_take_all(std::vector<Quantity> amounts) const {
  std::sort(amounts.begin(), amounts.end(), std::greater<>());
  GpuPool copy = *this;
  for (Quantity q : amounts) {
    if (!copy.can_take(q)) return false;
    copy.take(q);
  }
  return true;
}

std::vector<GpuShare> GpuPool::take(Quantity amount) {
  std::vector<GpuShare> out;
  const std::int64_t units = amount.units();
  if (units <= 0) return out;
  if (units < kOne) {
    Slot& s = slots_[best_fit(units)];
    s.free -= units;
    out.push_back({s.index, amount});
    return out;
  }
  std::int64_t need = units / kOne;
  for (Slot& s : slots_) {
    if (need == 0) break;
    if (s.free != kOne) continue;
    s.free = 0;
    out.push_back({s.index, Quantity::whole(1)});
    --need;
  }
  return out;
}

void GpuPool::give(const std::vector<GpuShare>& shares) {
  for (const GpuShare& share : shares)
    for (Slot& s : slots_)
      if (s.index == share.index) {
        s.free += share.amount.units();
        break;
      }
}

std::vector<Quantity> GpuPool::free_per_device() const {
  std::vector<Quantity> out;
  for (const Slot& s : slots_) out.push_back(Quantity::from_units(s.free));
  return out;
}

Quantity GpuPool::total_free() const {
  std::int64_t sum = 0;
  for (const Slot& s : slots_) sum += s.free;
  return Quantity::from_units(sum);
}

}  // namespace troupe::placement::detail
