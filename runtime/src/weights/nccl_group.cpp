#include "weights/nccl_group.hpp"

#include <spdlog/spdlog.h>

#include "troupe/weight_types.hpp"
#include "weights/gpu_sync.hpp"
#include "weights/set_builder.hpp"

namespace troupe::detail::weights {
namespace {

[[noreturn]] void transfer(const std::string& why) { throw WeightError(WeightError::Kind::Transfer, "Transfer: " + why); }

}  // namespace

GroupRoot::GroupRoot(std::string name, int size, int device, std::chrono::milliseconds timeout, std::uint64_t epoch,
                     std::shared_ptr<std::atomic<std::uint64_t>> broadcasts)
    : name_(std::move(name)), size_(size), device_(device), timeout_(timeout), epoch_(epoch),
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

int GroupRoot::seat(const std::string& member) {
  std::lock_guard lock(mu_);
  if (!broken_.empty() || int(seated_.size()) >= size_ - 1 || seated_.count(member)) return 0;
  seated_.insert(member);
  return int(seated_.size());
}

WeightSetPtr GroupRoot::ask(const std::string& member, std::uint64_t version,
                            const std::function<WeightSetPtr(std::uint64_t)>& resolve) {
  std::lock_guard lock(mu_);
  if (!broken_.empty()) transfer("NCCL group " + name_ + " is broken: " + broken_);
  if (!seated_.count(member)) transfer("not a member of NCCL group " + name_ + " (epoch " + std::to_string(epoch_) + ")");
  if (!round_) {
    auto set = resolve(version);   // throws NotFound
    if (SetBuilder::device_image(*set) == nullptr) transfer("version " + std::to_string(set->version()) + " has no device mirror");
    round_ = std::move(set);
    asked_.clear();
    opened_ = std::chrono::steady_clock::now();
  } else if (version != kLatestVersion && version != round_->version()) {
    transfer("NCCL group " + name_ + " is broadcasting version " + std::to_string(round_->version()) + ", not " +
             std::to_string(version));
  }
  asked_.insert(member);
  changed_.notify_all();
  return round_;
}

std::string GroupRoot::broken() const {
  std::lock_guard lock(mu_);
  return broken_;
}

void GroupRoot::fail_locked(const std::string& why) {
  if (broken_.empty()) spdlog::warn("weights: NCCL group {} (epoch {}) broken: {}", name_, epoch_, why);
  broken_ = why;
  round_.reset();
  changed_.notify_all();
}

void GroupRoot::run() {
  std::string error;
  auto comm = gpu::NcclBroadcaster::create(id_, 0, size_, device_, timeout_, &error, &stop_);
  std::unique_lock lock(mu_);
  if (!comm) return fail_locked("forming the group: " + error);
  for (;;) {
    const bool waiting = changed_.wait_for(lock, std::chrono::milliseconds(100), [&] {
      return stop_.load() || (round_ && int(asked_.size()) >= size_ - 1);
    });
    if (stop_) return comm->abort();   // a healthy communicator's finalize would wait for the members
    if (!waiting) {
      if (round_ && std::chrono::steady_clock::now() - opened_ > timeout_) {
        comm->abort();   // members already receiving then fail at their own deadline
        return fail_locked("members did not all ask for version " + std::to_string(round_->version()) + " within " +
                           std::to_string(timeout_.count()) + " ms");
      }
      continue;
    }
    WeightSetPtr set = std::move(round_);   // pinned (WS-2) while it is broadcast; the next round may open
    round_.reset();
    asked_.clear();
    lock.unlock();
    const auto* image = SetBuilder::device_image(*set);
    const bool sent = comm->broadcast(image->buffer->data(), image->buffer->size(), 0, 0, timeout_, &error, &stop_);
    lock.lock();
    if (!sent) return fail_locked("broadcasting version " + std::to_string(set->version()) + ": " + error);
    broadcasts_->fetch_add(1);
  }
}

}  // namespace troupe::detail::weights
