// Dynamic balancing: send each next item to the group member with the least outstanding cost.
// Used by ActorGroup::call_balanced(cost, ...): acquire before the call, release when its
// future resolves (value or error).
//
// Thread-safe: every method may be called from any thread; each takes one short lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <set>
#include <tuple>
#include <vector>

namespace troupe::placement {

class LeastLoadedDispatcher {
 public:
  // What acquire() charged; hand it back to release() exactly once.
  struct Ticket {
    std::size_t member = 0;
    std::int64_t cost = 0;
  };

  explicit LeastLoadedDispatcher(std::size_t members = 0);

  // Charges `cost` (>= 0) to the active member with the least outstanding cost; ties go to the
  // member with fewer outstanding items, then the lower index (so zero-cost calls rotate).
  // nullopt when no member is active.
  std::optional<Ticket> acquire(std::int64_t cost);
  // Returns a ticket's cost. Tickets of removed members are accepted.
  void release(const Ticket& ticket);

  // Elastic groups: a new member starts empty; a removed member gets no new work (its index is
  // never reused, so tickets stay unambiguous).
  std::size_t add_member();
  void remove_member(std::size_t member);

  std::int64_t outstanding_cost(std::size_t member) const;
  std::int64_t outstanding_items(std::size_t member) const;
  std::size_t member_count() const;  // including removed ones

 private:
  struct Load {
    std::int64_t cost = 0;
    std::int64_t items = 0;
    bool active = true;
  };
  using Key = std::tuple<std::int64_t, std::int64_t, std::size_t>;  // cost, items, member

  mutable std::mutex mu_;
  std::vector<Load> loads_;
  std::set<Key> order_;  // active members, least loaded first
};

}  // namespace troupe::placement
