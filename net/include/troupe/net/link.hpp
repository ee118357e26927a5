// Links: the control plane between troupe processes. A link is one TCP connection between two
// processes (Boost.Asio), authenticated at both ends by the cluster token without sending it (an
// HMAC-SHA256 challenge-response over fresh nonces), then carrying messages both ways: a kind
// byte and a body. Messages larger than a chunk travel as chunks that any small message may pass,
// so a heartbeat never waits behind a big call; each side sends a heartbeat when it has been
// silent for `heartbeat`, and a link that hears nothing for `silence_limit` is closed as frozen.
//
// Frames on the wire: [u32 little-endian length][u8 kind][u8 flags][body], length counting kind,
// flags and body. flags: chunk (part of a larger message), first (its body opens with the
// message's u64 size), last. Before the handshake ends every frame is bounded by 4 KiB; after it,
// by kMaxChunk, and a message by kMaxMessage. Anything malformed closes that link, nothing else.
//
// One io thread per LinkHub runs every link's reads, accepts and timers; handlers run on it and
// must be short. Sends are made on the sender's own thread (no hop), one frame at a time.
//
// Lanes (LinkOptions::lane): a link between two processes on one host whose hubs both allow it
// moves its messages to shared memory right after the handshake (lane.hpp: a ring each way; the
// socket stays for heartbeats, doorbells and the end of the link). A message then costs no system
// call while a thread of the receiver looks at the lane: its io thread while it lingers, or any
// thread inside a LaneWatch (a caller waiting for a reply, an actor waiting for its next call),
// which handles the messages itself, so the io thread's hop drops out of a call's round trip.
// Such a link's message handler must therefore be safe to run on any thread, one message at a
// time per link (several links' handlers may run at once). Order per link is kept across the
// switch: each side's last message on the socket says that its next ones come by the lane.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace troupe::net {

inline constexpr std::uint32_t kMaxChunk = 256u << 10;          // a frame's body after the handshake
inline constexpr std::uint64_t kMaxMessage = std::uint64_t(4) << 30;

// The version of what troupe's links carry: the frames and messages after the handshake
// (frames.hpp, head_link.hpp, the runtime's call messages) and a lane's layout (lane.hpp's
// kLayout). Both ends of a link say theirs in the handshake; the accepting end refuses a link
// between two versions and tells the other why, naming both, instead of one end misreading the
// other's bytes: a cluster runs one troupe build. Raise it with any change to those bytes. Builds
// before the number said none (0); they refuse this build's identity as malformed.
inline constexpr std::uint32_t kWireVersion = 1;

// Who is at the other end, as it said in the handshake (authenticated: it holds the token).
struct PeerIdentity {
  std::string host;               // its hostname: a pid means something only on the same host
  std::uint32_t pid = 0;
  std::uint64_t start_time = 0;   // /proc/<pid>/stat's starttime (clock ticks since boot): pid reuse
  std::string role;               // "driver", "worker 7": for logs
  std::uint32_t wire_version = kWireVersion;   // what its links carry (above)
};

// This process, as it presents itself.
PeerIdentity self_identity(std::string role);
// On the same host: whether the process `peer` names has exited (gone, a zombie, or its pid now
// another process). False for a peer on another host: only its daemon or the head can tell.
bool peer_exited(const PeerIdentity& peer);

struct LinkOptions {
  std::chrono::milliseconds heartbeat{500};         // a silent side sends a heartbeat this often
  std::chrono::milliseconds silence_limit{3000};    // nothing heard for this long: frozen, closed
  std::chrono::milliseconds handshake_timeout{5000};
  std::chrono::milliseconds send_timeout{10000};    // a peer that stops reading blocks a send this long
  // Same-host links to hubs that allow it too get a shared-memory lane (see above); the message
  // handlers of this hub's links must then be thread-safe. TROUPE_LINK_LANE=0 turns lanes off.
  bool lane = false;
};

class LinkHub;

// Why a link ended.
enum class LinkEnd {
  Closed,   // closed by this side (close(), or its hub stopping); not for a fault found here (Lost)
  Exited,   // the peer process exited: on this host, its pid was seen to end (pidfd)
  Frozen,   // the peer fell silent for silence_limit: frozen (SIGSTOP), or cut off
  Lost,     // EOF or an error with no exit seen: the peer may still run (another host, or it closed)
};

class Link : public std::enable_shared_from_this<Link> {
 public:
  // A whole message (its chunks joined), on the hub's io thread.
  using MessageHandler = std::function<void(Link& link, char kind, std::vector<char>& body)>;
  // Once, on the io thread, when the link ends: how and why. After an EOF from a peer on this host
  // the hub waits up to a moment for its pid to end, so that a dead process reads as Exited.
  using ClosedHandler = std::function<void(Link& link, LinkEnd end, const std::string& why)>;

  ~Link();
  Link(const Link&) = delete;
  Link& operator=(const Link&) = delete;

  // How a message leaves. Now: this call writes it (and any batched ones before it). Batched: a
  // small message may wait in the link's outbox for others to go in the same write: the io
  // thread writes the outbox on its next look for work (microseconds) while it is looking, this
  // call writes it when the io thread is parked, and so do flush_batched(), the next Now message,
  // or an outbox over 64 KiB. Either way messages leave in the order they were sent.
  enum class Send { Now, Batched };

  // Sends one message (kind: any byte from 0x20 up but 'h'; the rest are the links' own). Thread-safe; blocks until
  // the bytes are handed to the kernel (or, Batched, the outbox), at most send_timeout. False once
  // the link is closed (the message was not sent) or the body exceeds kMaxMessage. `to`, if not 0,
  // names the message's receiver in the peer as a thread of the peer waits for it (LaneWatch::sleep's
  // `waits_for`): by a lane, that thread is the one woken for it.
  bool send(char kind, const std::vector<char>& body, Send how = Send::Now, std::uint64_t to = 0);
  bool send(char kind, const char* data, std::size_t size, Send how = Send::Now, std::uint64_t to = 0);
  // Closes the link; the closed handler runs once. Idempotent, from any thread.
  void close(const std::string& why = "closed here");
  bool closed() const { return closed_.load(std::memory_order_acquire); }
  const PeerIdentity& peer() const { return peer_; }
  const std::string& address() const { return address_; }   // the peer's "host:port"
  // Whether this side's messages go by a shared-memory lane now (see above).
  bool has_lane() const;
  // Installs the handlers (a link accepted by a hub starts without: set them before it reads).
  void set_handlers(MessageHandler on_message, ClosedHandler on_closed);

  struct Impl;   // net/src/link_impl.hpp's

 private:
  friend class LinkHub;
  friend struct LinkLoops;
  friend void flush_batched();
  friend struct Lane;
  // close() for a fault this side found (a send that failed or timed out, a message refused):
  // the peer may well be alive, so its end reads Lost, not Closed, and the link's users link again.
  void close_on_fault(const std::string& why);
  // Writes the outbox now, waiting for the socket up to send_timeout (a full outbox's sender).
  void flush();
  // Writes what the socket takes of the outbox now; the io thread writes the rest once it can.
  void flush_some();
  void await_writable();
  explicit Link(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  PeerIdentity peer_;
  std::string address_;
  std::atomic<bool> closed_{false};
};

// Writes the batched messages of every link in this process, as far as each socket takes them
// without waiting (the io thread writes any rest once it can): a thread about to wait for replies
// calls it, so that its call is not left in an outbox meanwhile. Never blocks on a slow peer.
void flush_batched();

struct Lane;   // net/src/link_impl.hpp's

// While one lives, this thread counts as looking at every lane of this process that was open when
// it was made: their senders ring no doorbell, and drain() handles what they carry, here. For a
// thread about to wait for a message (a reply, the next call): between its looks it only spins
// briefly or sleeps in sleep(), where the lanes wake it. A watch whose thread does neither (busy
// with something else) holds up its lanes' messages, since their senders count on it to take them.
// Leaving, it handles what arrived meanwhile.
class LaneWatch {
 public:
  LaneWatch();
  ~LaneWatch();
  LaneWatch(const LaneWatch&) = delete;
  LaneWatch& operator=(const LaneWatch&) = delete;
  // Handles the messages waiting in the watched lanes (a lane another thread is draining is left
  // to it). Returns how many it handled.
  std::size_t drain();
  // Sleeps until a watched lane has a message, `word` (a word of this process that another thread
  // bumps and wakes with wake_word) no longer holds `seen`, or `until`; drain() takes what came.
  // Meanwhile the watched lanes' producers wake this thread themselves (a futex in the lane's
  // file) rather than ring its io thread, which would then hand the message on: one wake-up in
  // place of two. So a watch may last as long as a reply takes, if its thread sleeps here whenever
  // it has nothing to do. May return early (a wake-up for another sleeper): look, then sleep again.
  // False, at once, when it cannot: a watched lane's messages are being handled on this thread
  // (it cannot take them, and they must not wait for it), over 127 lanes, or no futex_waitv
  // (Linux < 5.16) or a refused one (seccomp). The caller then sleeps its own way, with no watch.
  // `waits_for`, if not 0, is the receiver this thread takes messages for (an actor's host: the id
  // its callers send to, Link::send's `to`): a message to it wakes this thread rather than another
  // sleeper, which would hand it over. At most one thread sleeps for a receiver at a time.
  bool sleep(const std::atomic<std::uint32_t>& word, std::uint32_t seen, std::chrono::steady_clock::time_point until,
             std::uint64_t waits_for = 0);

 private:
  std::vector<std::shared_ptr<Lane>> lanes_;
};

// Wakes every thread of this process asleep on `word` (LaneWatch::sleep); bump `word` first.
void wake_word(std::atomic<std::uint32_t>& word);

// A process's links: the io thread, a listener (optional) and the links it opened or accepted.
class LinkHub {
 public:
  // Called on the io thread with each newly authenticated incoming link; it must call
  // set_handlers before returning (the link starts reading then).
  using AcceptHandler = std::function<void(const std::shared_ptr<Link>& link)>;

  LinkHub(std::string token, PeerIdentity self, LinkOptions options = {});
  ~LinkHub();   // stop()
  LinkHub(const LinkHub&) = delete;
  LinkHub& operator=(const LinkHub&) = delete;

  // Listens on the address `bind` ("127.0.0.1"), on any free port, and returns "host:port". Throws
  // ErrorException(NetCode::Unreachable) if it cannot.
  std::string listen(const std::string& bind, AcceptHandler on_accept);
  // Connects to "host:port" and authenticates, within `timeout`. Throws
  // ErrorException(NetCode::Unreachable) (cannot reach) or ErrorException(NetCode::Refused)
  // (the peer does not hold this token, or is not a troupe process).
  std::shared_ptr<Link> connect(const std::string& address, Link::MessageHandler on_message,
                                Link::ClosedHandler on_closed, std::chrono::milliseconds timeout);
  // Closes the listener and every link and joins the io thread. Idempotent; not from a handler.
  void stop();
  const PeerIdentity& self() const;

  // Messages sent and received on this hub's links since it started (heartbeats not counted).
  struct Counts {
    std::uint64_t sent = 0;
    std::uint64_t received = 0;
  };
  Counts counts() const;

  struct Impl;   // net/src/link_impl.hpp's

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace troupe::net
