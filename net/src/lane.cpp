#include "lane.hpp"

#include <fcntl.h>
#include <linux/futex.h>
#include <openssl/rand.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>

#include "frame_header.hpp"

namespace troupe::net::lane {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::size_t kHeaderPage = 4096;
// How long a producer short of room yields before it sleeps on the futex: the consumer is
// usually taking frames right now.
constexpr auto kYieldFor = std::chrono::microseconds(50);
// A futex sleep's longest slice: the producer looks at `stop` and its deadline between slices
// (a link closed meanwhile does not wake it).
constexpr auto kSleepSlice = std::chrono::milliseconds(10);

// The header page: what the file is, then the two rings' words.
struct Header {
  Magic magic;
  std::uint64_t capacity;
  std::uint32_t layout;   // kLayout of the build that made it (0 in files of builds before the word)
  alignas(64) Control rings[2];
};
static_assert(sizeof(Header) <= kHeaderPage);

// Not FUTEX_PRIVATE: the word is shared with another process.
void futex_wait(std::atomic<std::uint32_t>& word, std::uint32_t seen, std::chrono::nanoseconds for_) {
  timespec ts{};
  ts.tv_sec = time_t(for_.count() / 1'000'000'000);
  ts.tv_nsec = long(for_.count() % 1'000'000'000);
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAIT, seen, &ts, nullptr, 0);
}

void futex_wake(std::atomic<std::uint32_t>& word) {
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAKE, 1, nullptr, nullptr, 0);
}

std::size_t file_size(std::uint64_t capacity) { return kHeaderPage + 2 * std::size_t(capacity); }

bool sane_capacity(std::uint64_t capacity) {
  return capacity >= 2 * (kFrameHeader + (256u << 10)) && capacity <= (std::uint64_t(64) << 20) && capacity % 4096 == 0;
}

// Copies n bytes to / from a ring of `cap` bytes at stream offset `at`, wrapping at its end.
void copy_to_ring(char* ring, std::uint64_t cap, std::uint64_t at, const char* from, std::size_t n) {
  while (n > 0) {
    const std::size_t off = std::size_t(at % cap), k = std::min<std::size_t>(n, std::size_t(cap) - off);
    std::memcpy(ring + off, from, k);
    from += k, n -= k, at += k;
  }
}

void copy_from_ring(const char* ring, std::uint64_t cap, std::uint64_t at, char* to, std::size_t n) {
  while (n > 0) {
    const std::size_t off = std::size_t(at % cap), k = std::min<std::size_t>(n, std::size_t(cap) - off);
    std::memcpy(to, ring + off, k);
    to += k, n -= k, at += k;
  }
}

[[noreturn]] void fail(const std::string& what) { throw std::runtime_error(what + ": " + std::strerror(errno)); }

}  // namespace

std::shared_ptr<Mapping> Mapping::create(std::uint64_t capacity) {
  if (!sane_capacity(capacity)) throw std::runtime_error("a lane's capacity out of range");
  std::shared_ptr<Mapping> m(new Mapping());
  m->capacity_ = capacity;
  m->size_ = file_size(capacity);
  m->fd_ = int(::syscall(SYS_memfd_create, "troupe-lane", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (m->fd_ < 0) fail("memfd_create");
  if (::ftruncate(m->fd_, off_t(m->size_)) != 0) fail("ftruncate");
  // Its size is fixed for good: neither side can shrink it under the other's mapping (a SIGBUS).
  if (::fcntl(m->fd_, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) fail("sealing");
  m->map();
  if (RAND_bytes(m->magic_.data(), int(m->magic_.size())) != 1) throw std::runtime_error("no random bytes");
  auto* h = new (m->base_) Header{};   // the file is zeros: this only starts the atomics' lifetimes
  h->magic = m->magic_;
  h->capacity = capacity;
  h->layout = kLayout;
  return m;
}

std::shared_ptr<Mapping> Mapping::open(std::uint32_t pid, int fd, const Magic& magic, std::uint64_t capacity) {
  if (!sane_capacity(capacity) || fd < 0) throw std::runtime_error("a lane offer out of range");
  std::shared_ptr<Mapping> m(new Mapping());
  m->capacity_ = capacity;
  m->size_ = file_size(capacity);
  const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
  // Looked at before it is opened for writing (O_PATH opens nothing: no device, no FIFO), then
  // reopened without blocking; only a sealed memfd of the right size is taken.
  const int at = ::open(path.c_str(), O_PATH | O_CLOEXEC);
  if (at < 0) fail("cannot open " + path);
  struct stat st {};
  const bool regular = ::fstat(at, &st) == 0 && S_ISREG(st.st_mode) && std::uint64_t(st.st_size) == m->size_;
  if (regular) m->fd_ = ::open(("/proc/self/fd/" + std::to_string(at)).c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC);
  ::close(at);
  if (!regular) throw std::runtime_error(path + " is not a lane file");
  if (m->fd_ < 0) fail("cannot open " + path);
  const int seals = ::fcntl(m->fd_, F_GET_SEALS);
  if (seals < 0 || (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW)) {
    throw std::runtime_error(path + " is not a sealed lane file");
  }
  m->map();
  const auto* h = static_cast<const Header*>(m->base_);
  if (std::memcmp(h->magic.data(), magic.data(), magic.size()) != 0 || h->capacity != capacity) {
    throw std::runtime_error(path + " is not the lane offered");   // another file: a reused pid
  }
  if (h->layout != kLayout) {   // a peer of another build: its messages stay on the socket
    throw std::runtime_error(path + " is a lane of layout " + std::to_string(h->layout) + ", not " + std::to_string(kLayout));
  }
  m->magic_ = magic;
  m->close_fd();   // mapped: the descriptor is no longer needed
  return m;
}

void Mapping::map() {
  base_ = ::mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  if (base_ == MAP_FAILED) {
    base_ = nullptr;
    fail("mmap");
  }
  ::madvise(base_, size_, MADV_DONTFORK);   // a child forked to exec something holds no lane
  // Every page in this process's page tables now, not at a message's first touch: on a small VM a
  // page fault costs ~30-90 us, and a frame on fresh pages paid it on each side (measured: a 4 KiB
  // call's copy into the ring 67 us, out of it 94 us). A lane that carries little (a reward's
  // calls, a few KiB a step) was on fresh pages for hundreds of calls. It costs the file's 2 MiB
  // from the start, which a busy lane holds after its first turn anyway. Best effort: Linux 5.14+.
  ::madvise(base_, size_, MADV_POPULATE_WRITE);
}

Mapping::~Mapping() {
  if (base_ != nullptr) ::munmap(base_, size_);
  close_fd();
}

void Mapping::close_fd() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

Control& Mapping::control(int ring) const { return static_cast<Header*>(base_)->rings[ring]; }

char* Mapping::data(int ring) const { return static_cast<char*>(base_) + kHeaderPage + std::size_t(ring) * capacity_; }

// ---- producer -----------------------------------------------------------------------------------

Producer::Producer(std::shared_ptr<Mapping> map, int ring)
    : map_(std::move(map)), c_(map_->control(ring)), data_(map_->data(ring)), cap_(map_->capacity()) {}

Producer::Put Producer::put(const iovec* parts, int count, std::size_t total, Clock::time_point deadline,
                            const std::atomic<bool>& stop, std::uint64_t to) {
  if (total > cap_) return Put::Broken;
  const auto yield_until = Clock::now() + kYieldFor;
  for (;;) {
    const std::uint64_t used = head_ - c_.tail.load(std::memory_order_acquire);
    if (used > cap_) return Put::Broken;   // a tail ahead of the head, or too far behind
    if (cap_ - used >= total) break;
    if (stop.load(std::memory_order_acquire)) return Put::Stopped;
    const auto now = Clock::now();
    if (now >= deadline) return Put::Timeout;
    if (now < yield_until) {
      sched_yield();
      continue;
    }
    // Sleep until the consumer makes room. `waiting` and the tail are a seq_cst pair with the
    // consumer's tail and `waiting` (Consumer::next): one of the two sides sees the other.
    const std::uint32_t seen = c_.room.load();
    c_.waiting.store(1);
    if (cap_ - (head_ - c_.tail.load()) < total) {
      futex_wait(c_.room, seen, std::min<std::chrono::nanoseconds>(kSleepSlice, deadline - now));
    }
    c_.waiting.store(0);
  }
  const std::uint64_t before = head_;
  // Rewinding (lane.hpp): the consumer has taken every frame (and cannot take more until this
  // one is published), and this one fits before the current offset.
  if (const std::uint64_t off = head_ % cap_; off != 0 && cap_ - off >= kFrameHeader && total <= off &&
                                               c_.tail.load(std::memory_order_acquire) == head_) {
    char skip[kFrameHeader];
    put_header(skip, std::uint32_t(cap_ - off - kFrameHeader), kSkip, 0);
    copy_to_ring(data_, cap_, head_, skip, sizeof skip);
    head_ += cap_ - off;
  }
  for (int i = 0; i < count; ++i) {
    copy_to_ring(data_, cap_, head_, static_cast<const char*>(parts[i].iov_base), parts[i].iov_len);
    head_ += parts[i].iov_len;
  }
  // Published; then, seq_cst with the consumers' `awake` (LaneWatch): a consumer that stopped
  // looking before this sees the frame when it checks once more, or this sees no one awake.
  c_.head.store(head_);
  if (c_.awake.load() == 0 && c_.rung.exchange(1) == 0) return Put::Ring;
  // The same pair with the sleepers' count and their look at the ring (LaneWatch::sleep). One of
  // them: it takes whatever the ring holds and hands each message to its thread (whose own bell it
  // rings), so that a process whose many hosts sleep here wakes one thread, not all. And only for
  // a frame that found every earlier one taken: while one waits, whoever takes it takes this one
  // next (a consumer looks again after each frame, and a sleeper before it sleeps), so a burst of
  // frames wakes one thread, not one each. The one is the thread asleep for this frame's receiver
  // if there is one (a NamedSleeper claimed before it looked at the ring: the same seq_cst pair),
  // so that a process whose several hosts sleep here wakes the host the call is for: any other
  // takes the frame and hands it over, a second wake-up (~100 us on a small VM).
  if (c_.sleepers.load() != 0 && c_.tail.load() == before) {
    std::atomic<std::uint32_t>* bell = &c_.bell;
    if (to != 0) {
      for (auto& n : c_.named) {
        if (n.key.load() == to) {
          bell = &n.bell;
          break;
        }
      }
    }
    bell->fetch_add(1);
    futex_wake(*bell);
  }
  return Put::Ok;
}

// ---- consumer -----------------------------------------------------------------------------------

Consumer::Consumer(std::shared_ptr<Mapping> map, int ring)
    : map_(std::move(map)), c_(map_->control(ring)), data_(map_->data(ring)), cap_(map_->capacity()) {}

Consumer::Got Consumer::next(std::uint32_t max_body, char& kind, std::uint8_t& flags, std::vector<char>& body) {
  std::uint64_t avail = c_.head.load() - tail_;   // seq_cst: after a failed try_lock too (Lane::drain)
  if (avail == 0) return Got::None;
  if (avail > cap_ || avail < kFrameHeader) return Got::Broken;   // frames are published whole
  unsigned char h[kFrameHeader];
  copy_from_ring(data_, cap_, tail_, reinterpret_cast<char*>(h), sizeof h);
  if (h[4] == static_cast<unsigned char>(kSkip)) {   // the producer went back to the ring's start
    const std::uint32_t n = get_le<std::uint32_t>(reinterpret_cast<const char*>(h));
    const std::uint64_t span = kFrameHeader + std::uint64_t(n) - 2;
    // It ends at the ring's end, and the frame published with it follows.
    if (n < 2 || (tail_ + span) % cap_ != 0 || span + kFrameHeader > avail) return Got::Broken;
    tail_ += span;
    avail -= span;
    copy_from_ring(data_, cap_, tail_, reinterpret_cast<char*>(h), sizeof h);
    if (h[4] == static_cast<unsigned char>(kSkip)) return Got::Broken;   // one skip per frame at most
  }
  const auto size = parse_header(h, max_body, kind, flags);
  if (!size || kFrameHeader + *size > avail) return Got::Broken;
  body.resize(*size);
  copy_from_ring(data_, cap_, tail_ + kFrameHeader, body.data(), *size);
  tail_ += kFrameHeader + *size;
  c_.tail.store(tail_);   // seq_cst, then `waiting`: see Producer::put
  if (c_.waiting.load() != 0) {
    c_.room.fetch_add(1);
    futex_wake(c_.room);
  }
  return Got::Frame;
}

bool Consumer::pending() const { return c_.head.load() != c_.tail.load(); }

std::uint64_t Consumer::published() const { return c_.head.load(std::memory_order_relaxed); }

}  // namespace troupe::net::lane
