// Private to the link files (net/src/link*.cpp): the state of a hub, of a link and of its lane, and
// what the files share. link.cpp: sending, and the hub (its io thread, listening, connecting,
// stopping); link_loops.cpp: a link's read loop, its own messages, its heartbeat and its end;
// link_lane.cpp: a lane's consuming side and LaneWatch; link_handshake.cpp: who is at the other end
// (identities) and the token handshake.
#pragma once

#include <utility>   // first: Boost 1.74's awaitable.hpp uses std::exchange without including it

#include <boost/asio.hpp>
#include <openssl/types.h>
#include <sys/uio.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <future>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "frame_header.hpp"
#include "lane.hpp"
#include "troupe/net/link.hpp"

namespace troupe::net {
namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

// A chunk; the first one (its body opens with the message's u64 size, so that the receiver makes
// room once instead of growing a buffer of hundreds of megabytes on its io thread); the last one.
inline constexpr std::uint8_t kChunkFlag = 1, kLastFlag = 2, kFirstFlag = 4;
inline constexpr char kHeartbeat = 'h';
// A link's own messages on the socket after the handshake (never handed to a handler; a sender's
// kinds start at 0x20): the offer of a lane (connector), its refusal (acceptor), a side's switch
// to it (each side's last message on the socket), a doorbell (frames wait in the lane).
inline constexpr char kLaneOffer = 1, kLaneRefused = 2, kLaneSwitch = 3, kDoorbell = 4;
inline bool internal_kind(char k) { return static_cast<unsigned char>(k) < 0x20 || k == kHeartbeat; }

inline std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

// ---- identities and the handshake (link_handshake.cpp) ------------------------------------------

inline constexpr std::size_t kTag = 32;
using Tag = std::array<unsigned char, kTag>;
using Bytes = std::span<const unsigned char>;

// HMAC-SHA256 keyed once with the cluster token; each tag dups the keyed template context.
class Hmac {
 public:
  explicit Hmac(const std::string& key);   // throws std::runtime_error
  ~Hmac();
  Hmac(const Hmac&) = delete;
  Hmac& operator=(const Hmac&) = delete;
  Tag operator()(std::initializer_list<Bytes> parts) const;   // throws std::runtime_error

 private:
  EVP_MAC* mac_ = nullptr;
  EVP_MAC_CTX* tmpl_ = nullptr;
};

std::vector<char> encode_identity(const PeerIdentity& id);
// Process `pid`'s start time (/proc/<pid>/stat, field 22); 0 when it cannot be read.
std::uint64_t process_start_time(std::uint32_t pid);

// The acceptor's side. Returns the peer's identity; throws ErrorException on a refusal.
asio::awaitable<PeerIdentity> accept_handshake(LinkHub::Impl& hub, tcp::socket& s);
// The connector's side.
asio::awaitable<PeerIdentity> connect_handshake(LinkHub::Impl& hub, tcp::socket& s);

// ---- shared state ----------------------------------------------------------------------------------

// Links (of every hub in this process) with batched messages in their outbox.
struct Batched {
  std::mutex mu;
  std::vector<std::shared_ptr<Link>> links;
  std::atomic<bool> any{false};   // links is not empty: a look costs one load when nothing waits
};

Batched& batched();   // link.cpp

// Joins a chunked message's chunks, whether they came by the socket or by a lane (feed is in
// link_lane.cpp, beside the lane's taker: that path is the latency-critical one).
struct Reassembly {
  std::vector<char> joined;
  char kind = 0;
  bool assembling = false;
  std::uint64_t expected = 0;

  // Takes one frame: the whole message (`body` itself, or the chunks joined into it) once it is
  // complete, nullptr while chunks are due. Throws std::runtime_error on a malformed sequence.
  std::vector<char>* feed(char k, std::uint8_t flags, std::vector<char>& body);
};

// Lanes whose peer has switched to them (Lane::open): what a LaneWatch looks at.
struct LaneRegistry {
  std::mutex mu;
  std::vector<std::shared_ptr<Lane>> lanes;
  std::atomic<std::size_t> count{0};   // lanes.size(): a watch costs one load while there are none
};
LaneRegistry& lanes();   // link_lane.cpp

// Whether this hub's same-host links get a lane: opts.lane, unless TROUPE_LINK_LANE=0. link.cpp.
bool lanes_allowed(const LinkOptions& o);

// For co_spawn: an exception that ends a link's coroutine is logged (asio::detached would drop it
// without a word, and the link would end unseen).
std::function<void(std::exception_ptr)> log_exception(const char* what);   // link_loops.cpp

// ---- the hub (link.cpp) ---------------------------------------------------------------------------

struct LinkHub::Impl : std::enable_shared_from_this<LinkHub::Impl> {
  Impl(std::string token, PeerIdentity self_id, LinkOptions o)
      : hmac(token), self(std::move(self_id)), self_bytes(encode_identity(self)), opts(o), lanes(lanes_allowed(o)),
        work(asio::make_work_guard(io)) {}

  asio::io_context io{1};
  Hmac hmac;
  PeerIdentity self;
  std::vector<char> self_bytes;
  LinkOptions opts;
  bool lanes;   // same-host links get a lane (opts.lane, unless TROUPE_LINK_LANE=0)
  asio::executor_work_guard<asio::io_context::executor_type> work;
  std::unique_ptr<tcp::acceptor> acceptor;
  AcceptHandler on_accept;
  std::mutex mu;
  std::vector<std::weak_ptr<Link>> links;
  bool stopping = false;
  std::thread thread;
  std::future<void> ran;   // ready once the io thread's run() has returned
  std::atomic<std::uint64_t> sent{0}, received{0};   // messages (not heartbeats)
  // While the io thread is in its linger loop it writes out batched messages on each look
  // (flush_batched); otherwise their sender does.
  std::atomic<bool> looking{false};

  // The io thread. After each handler it keeps looking for more work for a moment (kLinger),
  // giving its core to any other runnable thread between looks, before it parks in epoll_wait:
  // the reply to a call, or a synchronous caller's next call, usually comes within microseconds,
  // while waking a parked thread costs ~40 us on a small VM. A hub with nothing coming parks
  // kLinger after its last handler (a heartbeat every 500 ms: ~0.01 % of a core).
  // Each look also writes out the outboxes of batched messages (one write for all of a link's),
  // and takes the messages waiting in this process's lanes (while it looks, their senders ring no
  // doorbell).
  void serve();

  void remember(const std::shared_ptr<Link>& l);
};

// ---- a link (link.cpp) -----------------------------------------------------------------------------

struct Link::Impl {
  Impl(std::shared_ptr<LinkHub::Impl> h, tcp::socket s)
      : hub(std::move(h)), socket(std::move(s)), timer(hub->io), fd(socket.native_handle()) {}

  std::shared_ptr<LinkHub::Impl> hub;
  tcp::socket socket;
  asio::steady_timer timer;
  int fd;
  std::mutex write_mu;   // one write at a time; guards `sending`
  // Batched frames (headers included) not yet written. A sender appends under out_mu alone, so it
  // never waits for a write in progress; a writer takes the whole outbox (into `sending`) under
  // write_mu, so frames still leave in order.
  std::mutex out_mu;
  std::vector<char> outbox;    // out_mu
  std::vector<char> sending;   // write_mu: the outbox being written
  bool dirty = false;          // on the list of links with batched messages (Batched::mu)
  std::atomic<bool> awaiting_write{false};   // the io thread waits for the socket to take more
  std::mutex bulk_mu;    // one chunked message at a time (small ones pass between its chunks)
  MessageHandler on_message;
  ClosedHandler on_closed;
  std::mutex close_mu;     // guards the three below, and the descriptor's shutdown and close
  std::string close_reason;
  bool frozen = false;
  bool faulted = false;   // closed here for a fault (a failed send, a refused message): its end reads Lost
  bool fd_open = true;     // once false, `fd` may name another file: never touched again
  std::atomic<std::int64_t> last_sent{now_ns()}, last_heard{now_ns()};
  int pidfd = -1;          // the peer process, when it runs on this host: readable once it ends
  Link* self = nullptr;   // the Link (set as it is made)
  // The lane (same host, both hubs allowing it). Set on the io thread before this side switches
  // to it; read by senders once lane_on. lane_on: this side's messages go by the lane; set under
  // bulk_mu, write_mu and out_mu, so no message (nor a big one's chunk) straddles the switch.
  std::shared_ptr<Lane> lane;
  std::atomic<bool> lane_on{false};
  // The switch is due but a big message was going out (bulk_mu): its sender makes the switch as it
  // lets go of bulk_mu, so that the io thread never waits for a transfer (Lane::switch_to_lane).
  std::atomic<bool> switch_due{false};
  bool offerer = false;         // io thread: this side offered the lane (its file)
  bool peer_switched = false;   // io thread: the peer's messages come by the lane now
  std::uint64_t lane_heard = 0;   // io thread: the peer's published bytes when last looked at

  ~Impl() {
    if (pidfd >= 0) ::close(pidfd);
  }

  // Writes the outbox, then one frame whole (one sendmsg for all when the socket takes them), or
  // gives up at the deadline. write_mu held. False on an error or the timeout: the stream is then
  // unusable. A heartbeat (`!wait`) goes alone, only when the outbox is empty, and is skipped,
  // unwritten, when the socket is full.
  // `to`: the frame's receiver in the peer, for a lane's wake-up (lane::Producer::put).
  bool write_frame(char kind, std::uint8_t flags, const char* data, std::size_t size, bool wait, std::uint64_t to = 0);

  // Publishes one frame in the lane, and rings the doorbell when no thread of the peer looks at
  // it. write_mu held, lane_on.
  bool lane_frame(char kind, std::uint8_t flags, const char* data, std::size_t size, std::uint64_t to);

  // Writes the outbox alone. write_mu held.
  bool write_outbox();

  // Writes what it can of the outbox without waiting. Some: the socket is full, or a writer holds
  // write_mu (the rest is at the outbox's front; Link::flush_some has the io thread finish it).
  enum class Wrote { All, Some, Broken };
  Wrote try_write_outbox();

  // Moves the outbox into `sending` (empty). write_mu held.
  void take_outbox();

  // Appends a frame to the outbox. out_mu held.
  void queue_frame(char kind, const char* data, std::size_t size);

  bool write_all(iovec* iov, int parts, bool wait);
};

// ---- a lane (link_lane.cpp) -----------------------------------------------------------------------

// A link's lane (lane.hpp): the rings, and the consuming side's state. Its messages are handled
// by whichever thread drains it (the link's io thread, or one in a LaneWatch), one at a time.
struct Lane {
  Lane(std::shared_ptr<lane::Mapping> m, bool offerer, std::weak_ptr<Link> l)
      : map(std::move(m)), out(map, offerer ? 0 : 1), in(map, offerer ? 1 : 0), link(std::move(l)) {}

  // Frames one take() handles before it lets go: a thread that drains a busy lane returns to what
  // it waits for (its reply, the io thread's other links and heartbeats) in between.
  static constexpr std::size_t kTakeBudget = 64;

  std::shared_ptr<lane::Mapping> map;
  lane::Producer out;   // the link's write_mu
  lane::Consumer in;    // consume_mu
  std::weak_ptr<Link> link;
  std::mutex consume_mu;
  bool ended = false;        // consume_mu: the link ended; nothing more is taken
  Reassembly joined;         // consume_mu
  std::vector<char> body;    // consume_mu
  // A drain was asked for while another thread held consume_mu: that thread drains once more
  // when it lets go (drain()), so no message is left behind unseen.
  std::atomic<bool> wanted{false};
  std::atomic<std::thread::id> holder{};   // the thread in take(), if any

  // consume_mu held for the scope, and the thread marked as its holder.
  struct Holding {
    explicit Holding(Lane& l) : l(l) { l.holder.store(std::this_thread::get_id(), std::memory_order_relaxed); }
    ~Holding() { l.holder.store(std::thread::id(), std::memory_order_relaxed); }
    Lane& l;
  };

  // Handles up to kTakeBudget of the lane's messages, unless another thread is at it (it then
  // takes them as it lets go). How many it handled.
  static std::size_t drain(Lane& l);

  // Drains on the io thread what a watching thread left (its budget spent, or it stopped looking
  // with frames published while it looked, which rang no doorbell), a budget at a time with the
  // io thread's other work between. A lane whose holder is busy is left to it (`wanted`).
  static void hand_off(const std::shared_ptr<Lane>& l);

  // consume_mu held. Up to `budget` messages. `last`: the link has ended (its socket saw EOF):
  // take what the peer published before it went, as its socket's bytes would have been read.
  std::size_t take(std::size_t budget, bool last);

  // The peer's messages come by the lane from now on: watches see it.
  static void open(const std::shared_ptr<Lane>& l);

  // The link has ended: takes what is left if `deliver`, then nothing more (waits for a thread
  // that is handling its messages). On the io thread.
  static void end(const std::shared_ptr<Lane>& l, bool deliver);

  // This side's last message on the socket says that its next ones come by the lane. Made under
  // every lock a sender holds, so that no message or chunk straddles it: by the io thread (which
  // sets switch_due first) unless a big message is going out, else by that message's sender as it
  // lets go of bulk_mu. Either way, once.
  static void switch_to_lane(Link& link);
};

// ---- a link's loops (link_loops.cpp) --------------------------------------------------------------

// Runs on the io thread for the link's lifetime: reads messages, joins chunks, hands them over.
struct LinkLoops {
  static asio::awaitable<void> read(std::shared_ptr<Link> link);

  // A link's own message on the socket (heartbeat, lane offer, refusal, switch, doorbell): ""
  // when taken, else why the link ends. On the io thread.
  static std::string own_message(const std::shared_ptr<Link>& link, char kind, std::uint8_t flags, const std::vector<char>& body);

  // Offer (connector): a fresh lane file for the peer to open, as the link's first message.
  static void offer_lane(const std::shared_ptr<Link>& link);

  // Acceptor: opens the offered file and switches to it, or refuses (messages stay on the socket).
  static std::string take_offer(const std::shared_ptr<Link>& link, const std::vector<char>& body);

  static asio::awaitable<void> beat(std::shared_ptr<Link> link);

  static void start(const std::shared_ptr<Link>& link);

  static std::shared_ptr<Link> make(const std::shared_ptr<LinkHub::Impl>& hub, tcp::socket s, PeerIdentity peer);
};

}  // namespace troupe::net
