// Device-level GPU accounting, so fractional requests never straddle two devices.
//
// Rule (Ray's): a request below 1 GPU takes a slice of one device, best fit (the device with
// the least free room that still fits, so fractions stack); a request of n >= 1 whole GPUs
// takes n completely free devices, lowest index first.
#pragma once

#include <vector>

#include "troupe/placement/node.hpp"

namespace troupe::placement::detail {

class GpuPool {
 public:
  GpuPool() = default;
  // floor(total) whole devices plus one device holding the remainder, if any.
  static GpuPool for_node(Quantity total);
  // A pool over slices reserved elsewhere (a bundle's share of its node's devices).
  static GpuPool from_shares(const std::vector<GpuShare>& shares);

  bool can_take(Quantity amount) const;
  // True when all amounts can be taken together (checked largest first, as they would be).
  bool can_take_all(std::vector<Quantity> amounts) const;
  // Precondition: can_take(amount). Empty for a zero amount.
  std::vector<GpuShare> take(Quantity amount);
  void give(const std::vector<GpuShare>& shares);
  std::vector<Quantity> free_per_device() const;
  Quantity total_free() const;

 private:
  struct Slot {
    int index;
    std::int64_t free;
  };
  int best_fit(std::int64_t units) const;
  std::vector<Slot> slots_;
};

}  // namespace troupe::placement::detail
