// A lane: the shared-memory path of a link between two processes on one host (link_loops.cpp decides
// when a link has one). One shared file (a memfd of the process that offered the lane, opened by
// the other through /proc/<pid>/fd) holds two byte rings, one each way; each ring carries the
// link's frames exactly as the socket would ([u32 length][kind][flags][body]), has one producer
// (the link's write lock) and one consumer at a time (the lane's consume lock), and is checked on
// every read: the other end is authenticated but its bytes are still untrusted. The file is sealed
// at its size (so no side can make the other's accesses fault), and the side that opens it takes
// nothing but a sealed regular file of the expected size.
//
// Waking: a consumer thread that looks at a ring counts itself in `awake`; a producer that
// publishes a frame while none looks asks for a doorbell (Put::Ring: the link sends one over its
// socket, whose io thread then takes the frames). So nothing sleeps between a call and its reply
// while someone looks, and nothing spins when nobody does. A looking thread may also sleep on the
// ring's `bell`, a futex in the file (LaneWatch::sleep): the producer then wakes it directly, one
// wake-up where a doorbell costs two (the io thread's, then the thread it hands the message to).
// A producer short of room waits on a futex in the file that the consumer bumps when it makes room.
//
// Rewinding: a frame that finds the ring empty (every frame before it taken) and fits before the
// ring's current offset goes at the ring's start, behind a skip frame (kind kSkip, its body never
// written) over the rest. A call and its reply then keep writing the same few pages, rather than
// moving on through the ring's megabyte and coming back to each page after ~12 turns of a 75 KiB
// reply. On the VM this is measured on, a frame's write to pages it had not touched for that long
// took ~60 us for 4 KiB and ~120-170 us for 75 KiB (no page fault counted; the same copy again
// right after, ~3 us); rewound, 2 us and 7 us (rl_step's DPO through a worker process, 2026-12-06).
#pragma once

#include <sys/uio.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

namespace troupe::net::lane {

using Magic = std::array<unsigned char, 16>;

// Each way. A frame is at most a link chunk (256 KiB) and its header, so a few fit at once.
inline constexpr std::uint64_t kCapacity = std::uint64_t(1) << 20;

// The shared words' layout, in the file's header: a peer that finds another (a process of another
// troupe build) refuses the lane and keeps the link on its socket. 2: Control's named sleepers;
// 3: skip frames.
inline constexpr std::uint32_t kLayout = 3;

// The kind of a skip frame (rewinding, above): no link message has it (their kinds are 0x20 and up).
inline constexpr char kSkip = 0;

// A consumer thread asleep for the frames to one receiver of its process (LaneWatch::sleep's
// `waits_for`: an actor's host): a frame to that receiver wakes this thread, not whichever sleeper
// the ring's own bell would wake. `key` 0: a free slot.
struct NamedSleeper {
  std::atomic<std::uint64_t> key;
  std::atomic<std::uint32_t> bell;   // futex word: bumped when a frame to `key` is published
  std::uint32_t unused;
};
inline constexpr int kNamedSleepers = 8;   // per ring; more such sleepers sleep on the ring's bell alone

// One ring's shared words. The producer writes head, the consumer tail: apart, on cache lines
// of their own.
struct Control {
  alignas(64) std::atomic<std::uint64_t> head;   // bytes published, ever
  alignas(64) std::atomic<std::uint64_t> tail;   // bytes taken, ever
  alignas(64) std::atomic<std::uint32_t> awake;  // consumer threads looking at the ring now
  std::atomic<std::uint32_t> sleepers;           // of those, the ones asleep on `bell` (LaneWatch::sleep)
  std::atomic<std::uint32_t> bell;               // futex word: bumped when a frame is published to sleepers
  std::atomic<std::uint32_t> rung;               // a doorbell is on its way (set by the producer)
  std::atomic<std::uint32_t> waiting;            // the producer waits for room
  std::atomic<std::uint32_t> room;               // futex word: bumped when room is made for it
  alignas(64) NamedSleeper named[kNamedSleepers];  // of the sleepers, those asleep for one receiver
};
static_assert(std::atomic<std::uint64_t>::is_always_lock_free && std::atomic<std::uint32_t>::is_always_lock_free,
              "lane words are shared between processes: they must be lock-free");

// The shared file, mapped: a header page, then ring 0's bytes (offerer to acceptor), then ring 1's.
class Mapping {
 public:
  // A fresh memfd of `capacity` bytes a ring, mapped. Throws std::runtime_error.
  static std::shared_ptr<Mapping> create(std::uint64_t capacity);
  // Process `pid`'s descriptor `fd` (same host and user), mapped, if it is a lane file with this
  // magic and capacity. Throws std::runtime_error saying why not.
  static std::shared_ptr<Mapping> open(std::uint32_t pid, int fd, const Magic& magic, std::uint64_t capacity);
  ~Mapping();
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;

  int fd() const { return fd_; }   // -1 once closed (the peer has mapped it, or will not)
  void close_fd();
  const Magic& magic() const { return magic_; }
  std::uint64_t capacity() const { return capacity_; }
  Control& control(int ring) const;
  char* data(int ring) const;

 private:
  Mapping() = default;
  void map();   // fd_ and size_ set; throws std::runtime_error
  void* base_ = nullptr;
  std::size_t size_ = 0;
  int fd_ = -1;
  Magic magic_{};
  std::uint64_t capacity_ = 0;
};

// The producing end of one ring. One thread at a time.
class Producer {
 public:
  Producer(std::shared_ptr<Mapping> map, int ring);
  enum class Put {
    Ok,        // published
    Ring,      // published, and no consumer looks: send the doorbell
    Stopped,   // not published: `stop` turned true while waiting for room
    Timeout,   // not published: no room by the deadline (the consumer stopped taking)
    Broken,    // not published: the shared indices make no sense (the peer wrote over them)
  };
  // Publishes `total` bytes gathered from `parts` (one frame, at most the capacity), waiting for
  // room until `deadline` or until `stop` is true; wakes a consumer asleep on the ring: the one
  // asleep for `to` (a NamedSleeper's key, 0: none) if there is one, else one on the bell.
  Put put(const iovec* parts, int count, std::size_t total, std::chrono::steady_clock::time_point deadline,
          const std::atomic<bool>& stop, std::uint64_t to = 0);

 private:
  std::shared_ptr<Mapping> map_;
  Control& c_;
  char* data_;
  std::uint64_t cap_;
  std::uint64_t head_ = 0;   // what this side published: the shared head is only its copy
};

// The consuming end of one ring. One thread at a time (its owner's lock).
class Consumer {
 public:
  Consumer(std::shared_ptr<Mapping> map, int ring);
  enum class Got { None, Frame, Broken };
  // The next frame, if one is published; Broken if what is there is malformed (a length over
  // `max_body`, a frame past the published bytes, indices that make no sense).
  Got next(std::uint32_t max_body, char& kind, std::uint8_t& flags, std::vector<char>& body);
  // Whether frames are published beyond those taken. Any thread.
  bool pending() const;
  // Bytes the producer has published, ever: it moves while the peer lives and sends. Any thread.
  std::uint64_t published() const;
  Control& control() const { return c_; }

 private:
  std::shared_ptr<Mapping> map_;
  Control& c_;
  const char* data_;
  std::uint64_t cap_;
  std::uint64_t tail_ = 0;   // what this side took
};

}  // namespace troupe::net::lane
