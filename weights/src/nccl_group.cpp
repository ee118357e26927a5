#include "nccl_group.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "gpu_sync.hpp"
#include "set_builder.hpp"

namespace troupe::detail::weights {
namespace {

// A gathering member polls every few milliseconds; one not seen for this long has gone.
constexpr auto kGatherStale = std::chrono::milliseconds(250);

[[noreturn]] void rejoin(const std::string& why) { throw ErrorException(Error{WeightCode::Rejoin, why}); }
[[noreturn]] void transfer(const std::string& why) { throw ErrorException(Error{WeightCode::Transfer, why}); }

}  // namespace

// ---- Forming ---------------------------------------------------------------------------------

bool Forming::arrive(const std::string& member, Clock::time_point now) {
  for (auto it = seen_.begin(); it != seen_.end();) it = now - it->second > stale_ ? seen_.erase(it) : std::next(it);
  seen_[member] = now;
  return int(seen_.size()) >= size_ - 1;
}

std::vector<std::string> Forming::members() const {
  std::vector<std::string> out;
  for (const auto& [m, t] : seen_) out.push_back(m);
  return out;
}

// ---- GroupRoot -------------------------------------------------------------------------------

GroupRoot::GroupRoot(std::string name, int device, std::vector<std::string> members, std::chrono::milliseconds timeout,
                     std::uint64_t epoch, std::shared_ptr<std::atomic<std::uint64_t>> broadcasts)
    : name_(std::move(name)), device_(device), members_(std::move(members)), timeout_(timeout), epoch_(epoch),
      broadcasts_(std::move(broadcasts)) {
  std::string error;
  auto id = gpu::NcclBroadcaster::make_id(&error);
  if (!id) throw std::runtime_error("NCCL group " + name_ + ": " + error);
  id_ = *id;
  thread_ = std::thread([this] { run(); });
}

GroupRoot::~GroupRoot() {
  stop_ = true;
  {
    std::lock_guard lock(mu_);
    changed_.notify_all();
  }
  thread_.join();
}

bool GroupRoot::seated(const std::string& member) const {
  return std::find(members_.begin(), members_.end(), member) != members_.end();
}

int GroupRoot::claim(const std::string& member) {
  std::lock_guard lock(mu_);
  auto it = std::find(members_.begin(), members_.end(), member);
  if (it == members_.end() || !claimed_.insert(member).second) return 0;
  return int(it - members_.begin()) + 1;
}

WeightSetPtr GroupRoot::ask(const std::string& member, std::uint64_t version,
                            const std::function<WeightSetPtr(std::uint64_t)>& resolve) {
  std::lock_guard lock(mu_);
  if (!broken_.empty()) rejoin("NCCL group " + name_ + " is broken: " + broken_ + ": join again");
  if (!claimed_.count(member)) rejoin("not a member of NCCL group " + name_ + " (epoch " + std::to_string(epoch_) + "): join again");
  if (!round_) {
    auto set = resolve(version);   // throws NotFound
    if (SetBuilder::device_image(*set) == nullptr) transfer("version " + std::to_string(set->version()) + " has no device mirror");
    round_ = std::move(set);
    asked_.clear();
    opened_ = std::chrono::steady_clock::now();
  }
  asked_.insert(member);   // in the open round, whatever it asked for: every rank must take part
  changed_.notify_all();
  return round_;
}

std::string GroupRoot::broken() const {
  std::lock_guard lock(mu_);
  return broken_;
}

void GroupRoot::fail_locked(const std::string& why, WeightSetPtr* dropped) {
  if (!stop_) spdlog::warn("weights: NCCL group {} (epoch {}) broken: {}", name_, epoch_, why);
  broken_ = why;
  *dropped = std::move(round_);
  round_.reset();
  changed_.notify_all();
}

void GroupRoot::run() {
  std::string error;
  auto comm = gpu::NcclBroadcaster::create(id_, 0, size(), device_, timeout_, &error, &stop_);
  WeightSetPtr dropped;   // destroyed after `lock` is released: freeing a version may sync a GPU
  std::unique_lock lock(mu_);
  if (!comm) return fail_locked("forming the group: " + error, &dropped);
  for (;;) {
    const bool full = changed_.wait_for(lock, std::chrono::milliseconds(100), [&] {
      return stop_.load() || (round_ && asked_.size() >= members_.size());
    });
    if (stop_) break;
    if (!full) {
      if (round_ && std::chrono::steady_clock::now() - opened_ > timeout_) {
        fail_locked("members did not all ask for version " + std::to_string(round_->version()) + " within " +
                    std::to_string(timeout_.count()) + " ms", &dropped);
        break;   // members already receiving fail at their own deadline
      }
      continue;
    }
    WeightSetPtr set = std::move(round_);   // pinned (WS-2) while it is broadcast; the next round may open
    round_.reset();
    asked_.clear();
    lock.unlock();
    const auto* image = SetBuilder::device_image(*set);
    const bool sent = comm->broadcast(image->buffer->data(), image->buffer->size(), 0, 0, timeout_, &error, &stop_);
    const auto version = set->version();
    set.reset();
    lock.lock();
    if (!sent) return fail_locked("broadcasting version " + std::to_string(version) + ": " + error, &dropped);
    broadcasts_->fetch_add(1);
  }
  lock.unlock();   // askers see the group broken at once, not after the abort
  comm->abort();
}

// ---- GroupTable ------------------------------------------------------------------------------

GroupTable::~GroupTable() {
  for (auto& [name, e] : groups_) retire(std::move(e.root));
  for (auto& f : retiring_) f.wait();
}

void GroupTable::retire(std::unique_ptr<GroupRoot> root) {
  std::erase_if(retiring_, [](std::future<void>& f) {
    return f.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  });
  if (!root) return;
  retiring_.push_back(std::async(std::launch::async, [r = std::move(root)]() mutable { r.reset(); }));
}

GroupSeat GroupTable::join(const std::string& group, int size, const std::string& member,
                           std::chrono::milliseconds timeout, std::chrono::milliseconds retry) {
  auto& e = groups_[group];
  const auto now = Forming::Clock::now();
  GroupSeat seat;
  seat.size = size;
  auto seat_in = [&](const GroupRoot& root, int rank) {
    seat.id.assign(root.id().begin(), root.id().end());
    seat.rank = rank;
    seat.epoch = root.epoch();
    seat.ready = true;
    return seat;
  };
  if (now < e.not_before) {   // held off after a failure: every member comes back at the same time
    seat.retry_in_ms = std::max<std::int64_t>(
        1, std::chrono::duration_cast<std::chrono::milliseconds>(e.not_before - now).count());
    return seat;
  }
  if (e.root) {
    if (e.root->size() == size && e.root->broken().empty()) {
      if (int rank = e.root->claim(member)) return seat_in(*e.root, rank);   // formed with this member
    }
    // Broken, resized, or a member joining again or anew: the group is gathered anew.
    retire(std::move(e.root));
  }
  if (!e.forming || e.forming->size() != size) e.forming.emplace(size, kGatherStale);
  if (!e.forming->arrive(member, now)) return seat;   // not all here yet
  std::unique_ptr<GroupRoot> root;
  try {
    root = std::make_unique<GroupRoot>(group, device_, e.forming->members(), timeout, ++epochs_, broadcasts_);
  } catch (...) {   // NCCL unusable here: hold everyone off rather than re-form at every poll
    e.forming.reset();
    e.not_before = now + retry;
    throw;
  }
  e.forming.reset();
  e.root = std::move(root);
  return seat_in(*e.root, e.root->claim(member));
}

void GroupTable::leave(const std::string& group, const std::string& member, std::chrono::milliseconds hold_off) {
  auto it = groups_.find(group);
  if (it == groups_.end()) return;
  auto& e = it->second;
  if (e.forming) e.forming->depart(member);
  if (e.root && e.root->seated(member)) retire(std::move(e.root));   // a group short of a rank is no group
  if (hold_off.count() > 0) e.not_before = std::max(e.not_before, Forming::Clock::now() + hold_off);
}

GroupRoot* GroupTable::find(const std::string& group, std::uint64_t epoch) {
  auto it = groups_.find(group);
  return it != groups_.end() && it->second.root && it->second.root->epoch() == epoch ? it->second.root.get() : nullptr;
}

}  // namespace troupe::detail::weights
