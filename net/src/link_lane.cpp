// A link's lane, the consuming side (link_impl.hpp; the rings themselves are lane.cpp's): draining,
// handing off to the io thread, the switch from the socket, the end; and LaneWatch.
#include "link_impl.hpp"   // first: it includes <utility> before Boost.Asio

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <limits>

#include <spdlog/spdlog.h>

namespace troupe::net {

std::vector<char>* Reassembly::feed(char k, std::uint8_t flags, std::vector<char>& body) {
  if (!(flags & kChunkFlag)) return &body;   // a small message may pass between a big one's chunks
  const bool first = flags & kFirstFlag;
  if (first != !assembling || (!first && k != kind)) throw std::runtime_error("chunks out of order");
  std::size_t from = 0;
  if (first) {
    if (body.size() < 8) throw std::runtime_error("a first chunk without its size");
    const auto total = get_le<std::uint64_t>(body.data());
    if (total > kMaxMessage) throw std::runtime_error("a message over the size limit");
    expected = total;
    joined.clear();
    joined.reserve(total);
    kind = k;
    assembling = true;
    from = 8;
  }
  if (joined.size() + (body.size() - from) > expected) throw std::runtime_error("a message longer than it said");
  joined.insert(joined.end(), body.begin() + std::ptrdiff_t(from), body.end());
  if (!(flags & kLastFlag)) return nullptr;
  if (joined.size() != expected) throw std::runtime_error("a message shorter than it said");
  assembling = false;
  body.swap(joined);
  std::vector<char>().swap(joined);
  return &body;
}

LaneRegistry& lanes() {
  static auto* r = new LaneRegistry;   // never destroyed: a hub stopping at exit may still reach it
  return *r;
}

std::size_t Lane::drain(Lane& l) {
  // Not again on a thread already handling one of its messages (a handler that waits for a
  // reply): consume_mu is not recursive, and that thread takes the rest once the handler returns.
  if (!l.in.pending() || l.holder.load(std::memory_order_relaxed) == std::this_thread::get_id()) return 0;
  std::size_t handled = 0;
  l.wanted.store(true);
  while (l.wanted.load() && handled < kTakeBudget) {
    std::unique_lock lk(l.consume_mu, std::try_to_lock);
    if (!lk.owns_lock()) break;   // its holder drains again as it lets go (seq_cst: it sees `wanted`)
    l.wanted.store(false);
    Holding h(l);
    handled += l.take(kTakeBudget, false);
  }
  return handled;
}

void Lane::hand_off(const std::shared_ptr<Lane>& l) {
  if (!l->in.pending()) return;
  auto lk = l->link.lock();
  if (!lk || lk->closed()) return;
  asio::post(lk->impl_->hub->io, [l] {
    if (drain(*l) > 0) hand_off(l);
  });
}

std::size_t Lane::take(std::size_t budget, bool last) {
  auto lk = link.lock();
  if (ended || !lk || (!last && lk->closed())) return 0;
  auto& m = *lk->impl_;
  std::size_t handled = 0;
  char kind = 0;
  std::uint8_t flags = 0;
  while (handled < budget) {
    const auto got = in.next(kMaxChunk, kind, flags, body);
    if (got == lane::Consumer::Got::None) break;
    if (got == lane::Consumer::Got::Broken) {
      lk->close_on_fault("the lane holds malformed frames");
      break;
    }
    m.last_heard.store(now_ns(), std::memory_order_relaxed);
    std::vector<char>* message = nullptr;
    try {
      if (internal_kind(kind)) throw std::runtime_error("a link's own message in its lane");
      message = joined.feed(kind, flags, body);
    } catch (const std::exception& e) {   // malformed, or a size no memory holds
      lk->close_on_fault(e.what());
      break;
    }
    if (message == nullptr) continue;
    m.hub->received.fetch_add(1, std::memory_order_relaxed);
    ++handled;
    try {
      if (m.on_message) m.on_message(*lk, kind, *message);
    } catch (const std::exception& e) {   // a bad message from the peer: this link ends
      lk->close_on_fault(std::string("a message was refused: ") + e.what());
      break;
    }
    if (message->capacity() > 4 * std::size_t(kMaxChunk)) std::vector<char>().swap(*message);   // a big one passed
    if (!last && lk->closed()) break;
  }
  return handled;
}

void Lane::open(const std::shared_ptr<Lane>& l) {
  auto& r = lanes();
  std::lock_guard lk(r.mu);
  r.lanes.push_back(l);
  r.count.store(r.lanes.size());
}

void Lane::end(const std::shared_ptr<Lane>& l, bool deliver) {
  {
    std::lock_guard lk(l->consume_mu);
    Holding h(*l);
    if (deliver) l->take(std::numeric_limits<std::size_t>::max(), true);
    l->ended = true;
  }
  auto& r = lanes();
  std::lock_guard lk(r.mu);
  std::erase(r.lanes, l);
  r.count.store(r.lanes.size());
}

void Lane::switch_to_lane(Link& link) {
  auto& m = *link.impl_;
  std::unique_lock bulk(m.bulk_mu, std::try_to_lock);
  if (!bulk.owns_lock() || !m.switch_due.exchange(false)) return;   // its holder switches as it lets go
  std::lock_guard wk(m.write_mu);
  if (link.closed()) return;
  {
    std::lock_guard ok(m.out_mu);   // from here a batched sender goes by the lane (after write_mu)
    m.lane_on.store(true);
  }
  // The outbox (batched before the switch) goes ahead of it, on the socket.
  if (!m.write_frame(kLaneSwitch, 0, nullptr, 0, true)) link.close_on_fault("a send failed (the stream is broken)");
}
LaneWatch::LaneWatch() {
  auto& r = lanes();
  if (r.count.load() == 0) return;
  {
    std::lock_guard lk(r.mu);
    lanes_ = r.lanes;
  }
  for (auto& l : lanes_) l->in.control().awake.fetch_add(1);
}

LaneWatch::~LaneWatch() {
  for (auto& l : lanes_) {
    // seq_cst, then pending(): a frame published before this is seen here, one after it rings
    // the doorbell (lane::Producer::put). What this thread does not take, its io thread does.
    l->in.control().awake.fetch_sub(1);
    try {
      Lane::drain(*l);
      Lane::hand_off(l);
    } catch (const std::exception& e) {   // a handler's own failure closes its link in take()
      spdlog::error("links: a lane could not be drained: {}", e.what());
    }
  }
}

std::size_t LaneWatch::drain() {
  std::size_t n = 0;
  for (auto& l : lanes_) n += Lane::drain(*l);
  return n;
}

namespace {

// futex_waitv's flags (linux/futex.h of Linux 6.1 names only the struct): a 32-bit word, and
// whether it is this process's alone. The lanes' bells are not: their files are mapped by two.
constexpr std::uint32_t kFutexU32 = 0x02, kFutexPrivate = FUTEX_PRIVATE_FLAG;
std::atomic<bool> no_waitv{false};   // futex_waitv failed here (missing, or refused): not used again

std::uint64_t address_of(const std::atomic<std::uint32_t>& word) { return reinterpret_cast<std::uintptr_t>(&word); }

}  // namespace

bool LaneWatch::sleep(const std::atomic<std::uint32_t>& word, std::uint32_t seen,
                      std::chrono::steady_clock::time_point until, std::uint64_t waits_for) {
  if (lanes_.size() >= FUTEX_WAITV_MAX || no_waitv.load(std::memory_order_relaxed)) return false;
  const auto me = std::this_thread::get_id();
  for (auto& l : lanes_) {
    if (l->holder.load(std::memory_order_relaxed) == me) return false;
  }
  futex_waitv waiters[FUTEX_WAITV_MAX] = {};
  waiters[0] = {seen, address_of(word), kFutexU32 | kFutexPrivate, 0};
  std::size_t n = 1;
  for (auto& l : lanes_) {
    auto& c = l->in.control();
    c.sleepers.fetch_add(1);
    waiters[n++] = {c.bell.load(), address_of(c.bell), kFutexU32, 0};
  }
  // Asleep for one receiver: a slot of each lane's, where there is one free (and room among the
  // words), whose bell a frame to it rings instead of the lane's. Claimed before the look below.
  lane::NamedSleeper* named[FUTEX_WAITV_MAX] = {};
  std::size_t claimed = 0;
  for (std::size_t i = 0; waits_for != 0 && i < lanes_.size() && n < FUTEX_WAITV_MAX; ++i) {
    for (auto& slot : lanes_[i]->in.control().named) {
      std::uint64_t free = 0;
      if (!slot.key.compare_exchange_strong(free, waits_for)) continue;
      named[claimed++] = &slot;
      waiters[n++] = {slot.bell.load(), address_of(slot.bell), kFutexU32, 0};
      break;
    }
  }
  // seq_cst, after the count and the bell: a frame published before this is seen here; one after
  // it finds this thread counted and bumps the bell, which the sleep below sees (lane::Producer::put).
  // Only frames this thread could take count: not those of a lane whose link has ended (they stay
  // untaken), nor of one another thread is handling (it takes them as it lets go: the caller's
  // drain() asked it to, Lane::drain's `wanted`), lest this thread spin on them instead of sleeping.
  bool pending = false;
  for (auto& l : lanes_) {
    if (!l->in.pending() || l->holder.load(std::memory_order_relaxed) != std::thread::id()) continue;
    auto link = l->link.lock();
    pending = pending || (link && !link->closed());
  }
  if (pending) {
    std::this_thread::yield();   // a frame that came after the caller's drain(): the caller drains again
  } else {
    const auto since_epoch = until.time_since_epoch();
    const auto secs = std::chrono::duration_cast<std::chrono::seconds>(since_epoch);
    const timespec at{time_t(secs.count()), long(std::chrono::nanoseconds(since_epoch - secs).count())};
    const bool forever = until == std::chrono::steady_clock::time_point::max();
    if (::syscall(SYS_futex_waitv, waiters, n, 0, forever ? nullptr : &at, CLOCK_MONOTONIC) < 0 && errno != EAGAIN &&
        errno != ETIMEDOUT && errno != EINTR) {
      // No futex_waitv (Linux < 5.16: ENOSYS), or refused (a seccomp profile: EPERM): returning at
      // once would have the caller spin. From now on this process's waiters sleep their own way.
      no_waitv.store(true);
    }
  }
  for (std::size_t i = 0; i < claimed; ++i) named[i]->key.store(0);
  for (auto& l : lanes_) l->in.control().sleepers.fetch_sub(1);
  return !no_waitv.load(std::memory_order_relaxed);
}

void wake_word(std::atomic<std::uint32_t>& word) {
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
}

}  // namespace troupe::net
