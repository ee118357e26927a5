#include "troupe/placement/dispatcher.hpp"

namespace troupe::placement {

LeastLoadedDispatcher::LeastLoadedDispatcher(std::size_t members) {
  for (std::size_t i = 0; i < members; ++i) add_member();
}

std::optional<LeastLoadedDispatcher::Ticket> LeastLoadedDispatcher::acquire(std::int64_t cost) {
  std::lock_guard lock(mu_);
  if (order_.empty()) return std::nullopt;
  auto [old_cost, old_items, member] = *order_.begin();
  order_.erase(order_.begin());
  Load& l = loads_[member];
  l.cost += cost;
  ++l.items;
  order_.emplace(l.cost, l.items, member);
  return Ticket{member, cost};
}

void LeastLoadedDispatcher::release(const Ticket& t) {
  std::lock_guard lock(mu_);
  if (t.member >= loads_.size()) return;
  Load& l = loads_[t.member];
  if (l.active) order_.erase(Key{l.cost, l.items, t.member});
  l.cost -= t.cost;
  --l.items;
  if (l.active) order_.emplace(l.cost, l.items, t.member);
}

std::size_t LeastLoadedDispatcher::add_member() {
  std::lock_guard lock(mu_);
  loads_.push_back({});
  order_.emplace(0, 0, loads_.size() - 1);
  return loads_.size() - 1;
}

void LeastLoadedDispatcher::remove_member(std::size_t member) {
  std::lock_guard lock(mu_);
  if (member >= loads_.size() || !loads_[member].active) return;
  Load& l = loads_[member];
  order_.erase(Key{l.cost, l.items, member});
  l.active = false;
}

std::int64_t LeastLoadedDispatcher::outstanding_cost(std::size_t member) const {
  std::lock_guard lock(mu_);
  return member < loads_.size() ? loads_[member].cost : 0;
}

std::int64_t LeastLoadedDispatcher::outstanding_items(std::size_t member) const {
  std::lock_guard lock(mu_);
  return member < loads_.size() ? loads_[member].items : 0;
}

std::size_t LeastLoadedDispatcher::member_count() const {
  std::lock_guard lock(mu_);
  return loads_.size();
}

}  // namespace troupe::placement
