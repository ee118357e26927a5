#include <utility>   // first: Boost 1.74's awaitable.hpp uses std::exchange without including it

#include "troupe/net/link.hpp"

#include <charconv>

#include "troupe/proc_file.hpp"

#include <boost/asio.hpp>
#include <msgpack.hpp>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <poll.h>
#include <sched.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <future>
#include <limits>
#include <optional>
#include <span>
#include <sstream>
#include <thread>

#include "frame_header.hpp"
#include "lane.hpp"
#include "troupe/error.hpp"
#include "troupe/net/address.hpp"

namespace troupe::net {
namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace {

// How long the io thread looks for more work after a handler before it parks (LinkHub::Impl::serve).
constexpr auto kLinger = std::chrono::microseconds(50);
// Batched messages (Send::Batched): bodies up to kBatchedBody wait in a link's outbox, which is
// written out whole once it holds kOutbox bytes, if nothing flushed it before.
constexpr std::size_t kBatchedBody = 16u << 10, kOutbox = 64u << 10;
constexpr std::uint32_t kMaxHandshakeFrame = 4096;
// A chunk; the first one (its body opens with the message's u64 size, so that the receiver makes
// room once instead of growing a buffer of hundreds of megabytes on its io thread); the last one.
constexpr std::uint8_t kChunkFlag = 1, kLastFlag = 2, kFirstFlag = 4;
constexpr char kHeartbeat = 'h';
// A link's own messages on the socket after the handshake (never handed to a handler; a sender's
// kinds start at 0x20): the offer of a lane (connector), its refusal (acceptor), a side's switch
// to it (each side's last message on the socket), a doorbell (frames wait in the lane).
constexpr char kLaneOffer = 1, kLaneRefused = 2, kLaneSwitch = 3, kDoorbell = 4;
bool internal_kind(char k) { return static_cast<unsigned char>(k) < 0x20 || k == kHeartbeat; }
// The handshake: the acceptor's challenge, the connector's proof, the acceptor's answer.
constexpr char kChallenge = 'A', kProof = 'B', kAccepted = 'D', kRefusedFrame = 'E';
constexpr std::size_t kNonce = 32, kTag = 32;

using Tag = std::array<unsigned char, kTag>;
using Nonce = std::array<unsigned char, kNonce>;
using Bytes = std::span<const unsigned char>;

// HMAC-SHA256 keyed once with the cluster token; each tag dups the keyed template context.
class Hmac {
 public:
  explicit Hmac(const std::string& key) : mac_(EVP_MAC_fetch(nullptr, "HMAC", nullptr)) {
    tmpl_ = mac_ != nullptr ? EVP_MAC_CTX_new(mac_) : nullptr;
    char md[] = "SHA256";
    OSSL_PARAM p[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, md, 0), OSSL_PARAM_construct_end()};
    if (tmpl_ == nullptr ||
        EVP_MAC_init(tmpl_, reinterpret_cast<const unsigned char*>(key.data()), key.size(), p) != 1) {
      throw std::runtime_error("links: cannot set up HMAC-SHA256");
    }
  }
  ~Hmac() {
    EVP_MAC_CTX_free(tmpl_);
    EVP_MAC_free(mac_);
  }
  Hmac(const Hmac&) = delete;
  Hmac& operator=(const Hmac&) = delete;

  Tag operator()(std::initializer_list<Bytes> parts) const {
    EVP_MAC_CTX* c = EVP_MAC_CTX_dup(tmpl_);
    bool ok = c != nullptr;
    for (Bytes b : parts) ok = ok && EVP_MAC_update(c, b.data(), b.size()) == 1;
    Tag t{};
    std::size_t n = 0;
    ok = ok && EVP_MAC_final(c, t.data(), &n, t.size()) == 1 && n == t.size();
    EVP_MAC_CTX_free(c);
    if (!ok) throw std::runtime_error("links: HMAC failed");
    return t;
  }

 private:
  EVP_MAC* mac_ = nullptr;
  EVP_MAC_CTX* tmpl_ = nullptr;
};

Nonce fresh_nonce() {
  Nonce n{};
  if (RAND_bytes(n.data(), int(n.size())) != 1) throw std::runtime_error("links: no random bytes");
  return n;
}

Bytes bytes(const std::vector<char>& v) { return {reinterpret_cast<const unsigned char*>(v.data()), v.size()}; }
template <std::size_t N>
Bytes bytes(const std::array<unsigned char, N>& a) { return {a.data(), a.size()}; }

// A role byte in each proof, so that one side's proof offered back to it does not verify.
const unsigned char kConnectorRole[] = {'C'}, kAcceptorRole[] = {'S'};

std::vector<char> encode_identity(const PeerIdentity& id) {
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> pk(buf);
  pk.pack_array(4);
  pk.pack(id.host);
  pk.pack(id.pid);
  pk.pack(id.start_time);
  pk.pack(id.role);
  return std::vector<char>(buf.data(), buf.data() + buf.size());
}

PeerIdentity decode_identity(const char* data, std::size_t size) {
  std::size_t off = 0;
  msgpack::unpack_limit limits(/*array*/ 8, /*map*/ 0, /*str*/ 1024, /*bin*/ 0, /*ext*/ 0, /*depth*/ 2);
  auto h = msgpack::unpack(data, size, off, nullptr, nullptr, limits);
  const auto& o = h.get();
  if (off != size || o.type != msgpack::type::ARRAY || o.via.array.size != 4) throw std::runtime_error("bad identity");
  PeerIdentity id;
  o.via.array.ptr[0].convert(id.host);
  o.via.array.ptr[1].convert(id.pid);
  o.via.array.ptr[2].convert(id.start_time);
  o.via.array.ptr[3].convert(id.role);
  return id;
}

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

// /proc/<pid>/stat, "" when it cannot be read (the process is gone or going).
std::string proc_stat(std::uint32_t pid) {
  std::string text;
  return read_proc_file("/proc/" + std::to_string(pid) + "/stat", text) == 0 ? text : std::string();
}

std::uint64_t process_start_time(std::uint32_t pid) {
  const std::string text = proc_stat(pid);
  auto close = text.rfind(')');   // the command name may hold spaces and parentheses
  if (close == std::string::npos || close + 2 > text.size()) return 0;
  std::istringstream rest(text.substr(close + 2));
  std::string field;
  // Fields after the name: state (3), ..., starttime (22).
  for (int i = 3; i <= 22 && rest >> field; ++i) {
    if (i != 22) continue;
    std::uint64_t v = 0;
    auto [end, ec] = std::from_chars(field.data(), field.data() + field.size(), v);
    return ec == std::errc() ? v : 0;
  }
  return 0;
}

char process_state(std::uint32_t pid) {
  const std::string text = proc_stat(pid);
  auto close = text.rfind(')');
  return close == std::string::npos || close + 2 >= text.size() ? '\0' : text[close + 2];
}

std::string hostname() {
  char buf[256] = {};
  ::gethostname(buf, sizeof buf - 1);
  return buf;
}

}  // namespace

PeerIdentity self_identity(std::string role) {
  PeerIdentity id;
  id.host = hostname();
  id.pid = std::uint32_t(::getpid());
  id.start_time = process_start_time(id.pid);
  id.role = std::move(role);
  return id;
}

bool peer_exited(const PeerIdentity& peer) {
  if (peer.host != hostname() || peer.pid == 0) return false;
  char state = process_state(peer.pid);
  if (state == '\0' || state == 'Z' || state == 'X') return true;   // gone, or a zombie not yet reaped
  return peer.start_time != 0 && process_start_time(peer.pid) != peer.start_time;   // the pid is reused
}

namespace {

// Links (of every hub in this process) with batched messages in their outbox.
struct Batched {
  std::mutex mu;
  std::vector<std::shared_ptr<Link>> links;
  std::atomic<bool> any{false};   // links is not empty: a look costs one load when nothing waits
};

Batched& batched() {
  static Batched b;
  return b;
}

// Joins a chunked message's chunks, whether they came by the socket or by a lane.
struct Reassembly {
  std::vector<char> joined;
  char kind = 0;
  bool assembling = false;
  std::uint64_t expected = 0;

  // Takes one frame: the whole message (`body` itself, or the chunks joined into it) once it is
  // complete, nullptr while chunks are due. Throws std::runtime_error on a malformed sequence.
  std::vector<char>* feed(char k, std::uint8_t flags, std::vector<char>& body) {
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
};

// Lanes whose peer has switched to them (Lane::open): what a LaneWatch looks at.
struct LaneRegistry {
  std::mutex mu;
  std::vector<std::shared_ptr<Lane>> lanes;
  std::atomic<std::size_t> count{0};   // lanes.size(): a watch costs one load while there are none
};

LaneRegistry& lanes() {
  static auto* r = new LaneRegistry;   // never destroyed: a hub stopping at exit may still reach it
  return *r;
}

bool lanes_allowed(const LinkOptions& o) {
  const char* env = std::getenv("TROUPE_LINK_LANE");
  return o.lane && !(env != nullptr && std::string_view(env) == "0");
}

}  // namespace

// ---- the hub ------------------------------------------------------------------------------------

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
  void serve() {
    for (;;) {
      if (io.run_one() == 0) return;   // parked until something is ready; 0: out of work (stopped)
      looking.store(true);
      {
        LaneWatch watch;
        auto until = Clock::now() + kLinger;
        for (;;) {
          const std::size_t ran = io.poll() + watch.drain();
          flush_batched();
          if (io.stopped()) break;
          const auto now = Clock::now();
          if (ran > 0) until = now + kLinger;
          else if (now >= until) break;
          else sched_yield();
        }
      }
      looking.store(false);   // from here a batched message's sender writes it out itself...
      flush_batched();        // ...and what was queued before is written now (seq_cst: none is missed)
      if (io.stopped()) return;
    }
  }

  void remember(const std::shared_ptr<Link>& l) {
    std::lock_guard lk(mu);
    std::erase_if(links, [](const std::weak_ptr<Link>& w) { return w.expired(); });
    links.push_back(l);
  }
};

// ---- a link -------------------------------------------------------------------------------------

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
  bool write_frame(char kind, std::uint8_t flags, const char* data, std::size_t size, bool wait) {
    if (!internal_kind(kind) && lane_on.load(std::memory_order_relaxed)) return lane_frame(kind, flags, data, size);
    if (!wait) {   // a heartbeat: none needed while frames are going out; it never takes them
      std::lock_guard lk(out_mu);
      if (!outbox.empty()) return true;
    } else {
      take_outbox();
    }
    char header[6];
    put_header(header, std::uint32_t(size), kind, flags);
    iovec iov[3];
    int parts = 0;
    if (!sending.empty()) iov[parts++] = {sending.data(), sending.size()};
    iov[parts++] = {header, sizeof header};
    if (size > 0) iov[parts++] = {const_cast<char*>(data), size};
    const bool ok = write_all(iov, parts, wait);
    sending.clear();   // written, or the link is done
    return ok;
  }

  // Publishes one frame in the lane, and rings the doorbell when no thread of the peer looks at
  // it. write_mu held, lane_on.
  bool lane_frame(char kind, std::uint8_t flags, const char* data, std::size_t size);

  // Writes the outbox alone. write_mu held.
  bool write_outbox() {
    take_outbox();
    if (sending.empty()) return true;
    iovec iov{sending.data(), sending.size()};
    const bool ok = write_all(&iov, 1, true);
    sending.clear();
    return ok;
  }

  // Writes what it can of the outbox without waiting. Some: the socket is full, or a writer holds
  // write_mu (the rest is at the outbox's front; Link::flush_some has the io thread finish it).
  enum class Wrote { All, Some, Broken };
  Wrote try_write_outbox() {
    std::unique_lock lk(write_mu, std::try_to_lock);
    if (!lk.owns_lock()) return Wrote::Some;
    if (!fd_open) return Wrote::All;   // the link is done: nothing can be written
    take_outbox();
    std::size_t off = 0;
    while (off < sending.size()) {
      ssize_t n = ::send(fd, sending.data() + off, sending.size() - off, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      if (n < 0) {
        sending.clear();
        return Wrote::Broken;
      }
      off += std::size_t(n);
    }
    if (off > 0) last_sent.store(now_ns(), std::memory_order_relaxed);
    std::lock_guard ol(out_mu);
    if (off < sending.size()) outbox.insert(outbox.begin(), sending.begin() + std::ptrdiff_t(off), sending.end());
    sending.clear();
    return outbox.empty() ? Wrote::All : Wrote::Some;
  }

  // Moves the outbox into `sending` (empty). write_mu held.
  void take_outbox() {
    std::lock_guard lk(out_mu);
    sending.swap(outbox);
  }

  // Appends a frame to the outbox. out_mu held.
  void queue_frame(char kind, const char* data, std::size_t size) {
    char header[6];
    put_header(header, std::uint32_t(size), kind, 0);
    outbox.insert(outbox.end(), header, header + sizeof header);
    outbox.insert(outbox.end(), data, data + size);
  }

  bool write_all(iovec* iov, int parts, bool wait) {
    std::size_t left = 0;
    for (int i = 0; i < parts; ++i) left += iov[i].iov_len;
    const std::size_t total = left;
    const auto deadline = Clock::now() + hub->opts.send_timeout;
    int at = 0;
    while (left > 0) {
      msghdr msg{};
      msg.msg_iov = iov + at;
      msg.msg_iovlen = std::size_t(parts - at);
      ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) return false;
        if (!wait && left == total) return true;   // a heartbeat: skip it, nothing written
        auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
        if (ms <= 0) return false;
        pollfd p{fd, POLLOUT, 0};
        ::poll(&p, 1, int(std::min<std::int64_t>(ms, 1000)));
        continue;
      }
      left -= std::size_t(n);
      while (at < parts && std::size_t(n) >= iov[at].iov_len) {
        n -= ssize_t(iov[at].iov_len);
        ++at;
      }
      if (at < parts) {
        iov[at].iov_base = static_cast<char*>(iov[at].iov_base) + n;
        iov[at].iov_len -= std::size_t(n);
      }
    }
    last_sent.store(now_ns(), std::memory_order_relaxed);
    return true;
  }
};

// ---- a lane -------------------------------------------------------------------------------------

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
  static std::size_t drain(Lane& l) {
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

  // Drains on the io thread what a watching thread left (its budget spent, or it stopped looking
  // with frames published while it looked, which rang no doorbell), a budget at a time with the
  // io thread's other work between. A lane whose holder is busy is left to it (`wanted`).
  static void hand_off(const std::shared_ptr<Lane>& l) {
    if (!l->in.pending()) return;
    auto lk = l->link.lock();
    if (!lk || lk->closed()) return;
    asio::post(lk->impl_->hub->io, [l] {
      if (drain(*l) > 0) hand_off(l);
    });
  }

  // consume_mu held. Up to `budget` messages. `last`: the link has ended (its socket saw EOF):
  // take what the peer published before it went, as its socket's bytes would have been read.
  std::size_t take(std::size_t budget, bool last) {
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
        lk->close("the lane holds malformed frames");
        break;
      }
      m.last_heard.store(now_ns(), std::memory_order_relaxed);
      std::vector<char>* message = nullptr;
      try {
        if (internal_kind(kind)) throw std::runtime_error("a link's own message in its lane");
        message = joined.feed(kind, flags, body);
      } catch (const std::exception& e) {   // malformed, or a size no memory holds
        lk->close(e.what());
        break;
      }
      if (message == nullptr) continue;
      m.hub->received.fetch_add(1, std::memory_order_relaxed);
      ++handled;
      try {
        if (m.on_message) m.on_message(*lk, kind, *message);
      } catch (const std::exception& e) {   // a bad message from the peer: this link ends
        lk->close(std::string("a message was refused: ") + e.what());
        break;
      }
      if (message->capacity() > 4 * std::size_t(kMaxChunk)) std::vector<char>().swap(*message);   // a big one passed
      if (!last && lk->closed()) break;
    }
    return handled;
  }

  // The peer's messages come by the lane from now on: watches see it.
  static void open(const std::shared_ptr<Lane>& l) {
    auto& r = lanes();
    std::lock_guard lk(r.mu);
    r.lanes.push_back(l);
    r.count.store(r.lanes.size());
  }

  // The link has ended: takes what is left if `deliver`, then nothing more (waits for a thread
  // that is handling its messages). On the io thread.
  static void end(const std::shared_ptr<Lane>& l, bool deliver) {
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

  // This side's last message on the socket says that its next ones come by the lane. Made under
  // every lock a sender holds, so that no message or chunk straddles it: by the io thread (which
  // sets switch_due first) unless a big message is going out, else by that message's sender as it
  // lets go of bulk_mu. Either way, once.
  static void switch_to_lane(Link& link) {
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
    if (!m.write_frame(kLaneSwitch, 0, nullptr, 0, true)) link.close("a send failed (the stream is broken)");
  }
};

bool Link::Impl::lane_frame(char kind, std::uint8_t flags, const char* data, std::size_t size) {
  char header[kFrameHeader];
  put_header(header, std::uint32_t(size), kind, flags);
  iovec iov[2] = {{header, sizeof header}, {const_cast<char*>(data), size}};
  const auto put = lane->out.put(iov, size > 0 ? 2 : 1, sizeof header + size, Clock::now() + hub->opts.send_timeout,
                                 self->closed_);
  if (put != lane::Producer::Put::Ok && put != lane::Producer::Put::Ring) return false;
  last_sent.store(now_ns(), std::memory_order_relaxed);
  // Published: the peer takes it even if the doorbell cannot go (its end of the link takes what
  // was published before the EOF), so the send succeeded either way.
  if (put == lane::Producer::Put::Ring && !write_frame(kDoorbell, 0, nullptr, 0, true)) {
    self->close("a doorbell failed (the stream is broken)");
  }
  return true;
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

// ---- a link, continued --------------------------------------------------------------------------

Link::Link(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) { impl_->self = this; }

bool Link::has_lane() const { return impl_->lane_on.load(); }

Link::~Link() {
  boost::system::error_code ec;
  impl_->socket.close(ec);   // a link never started (its hub stopping): nothing else holds it
}

void Link::set_handlers(MessageHandler on_message, ClosedHandler on_closed) {
  impl_->on_message = std::move(on_message);
  impl_->on_closed = std::move(on_closed);
}

bool Link::send(char kind, const std::vector<char>& body, Send how) { return send(kind, body.data(), body.size(), how); }

bool Link::send(char kind, const char* data, std::size_t size, Send how) {
  if (closed() || internal_kind(kind) || size > kMaxMessage) return false;
  auto& m = *impl_;
  m.hub->sent.fetch_add(1, std::memory_order_relaxed);
  // By a lane a message costs a copy: nothing to batch.
  if (how == Send::Batched && size <= kBatchedBody && !m.lane_on.load(std::memory_order_relaxed)) {
    bool full = false, by_lane = false;
    {
      std::lock_guard lk(m.out_mu);
      if (closed()) return false;
      by_lane = m.lane_on.load(std::memory_order_relaxed);   // switched meanwhile: by the lane, below
      if (!by_lane) {
        m.queue_frame(kind, data, size);
        full = m.outbox.size() >= kOutbox;
      }
    }
    if (by_lane) {
      // switched meanwhile: a Now send below, which goes by the lane
    } else if (!full) {
      auto& b = batched();
      {
        std::lock_guard lk(b.mu);
        if (!m.dirty) {
          m.dirty = true;
          b.links.push_back(shared_from_this());
          b.any.store(true);   // seq_cst, like the load of `looking` below and the io thread's pair
        }
      }
      if (m.hub->looking.load()) return true;   // its io thread writes it on its next look (seq_cst)
      flush_batched();   // the io thread is parked: this one writes it (and takes it off the list)
    } else {
      flush();   // a full outbox: this sender waits for the socket, as a Now send does
    }
    if (!by_lane) return !closed();
  }
  if (size <= kMaxChunk) {
    std::lock_guard lk(m.write_mu);
    if (closed()) return false;
    if (m.write_frame(kind, 0, data, size, true)) return true;
  } else {
    std::unique_lock bulk(m.bulk_mu);
    std::size_t off = 0;
    bool ok = true;
    while (ok && off < size) {
      const bool first = off == 0;
      std::size_t n = std::min<std::size_t>(kMaxChunk - (first ? 8 : 0), size - off);
      std::uint8_t flags = kChunkFlag | (first ? kFirstFlag : 0) | (off + n == size ? kLastFlag : 0);
      std::lock_guard lk(m.write_mu);   // per chunk: a heartbeat or a small message may go between
      if (first) {
        std::vector<char> head(8 + n);
        put_le<std::uint64_t>(head.data(), size);
        std::memcpy(head.data() + 8, data, n);
        ok = !closed() && m.write_frame(kind, flags, head.data(), head.size(), true);
      } else {
        ok = !closed() && m.write_frame(kind, flags, data + off, n, true);
      }
      off += n;
    }
    bulk.unlock();
    if (m.switch_due.load()) Lane::switch_to_lane(*this);   // due while this message went out
    if (ok) return true;
  }
  close("a send failed or timed out (the peer stopped reading)");
  return false;
}

void Link::flush() {
  auto& m = *impl_;
  std::lock_guard lk(m.write_mu);
  if (closed()) return;
  if (!m.write_outbox()) close("a send failed or timed out (the peer stopped reading)");
}

void Link::flush_some() {
  auto& m = *impl_;
  if (closed()) return;
  const auto wrote = m.try_write_outbox();
  if (wrote == Impl::Wrote::All) return;
  if (wrote == Impl::Wrote::Broken) {
    close("a send failed (the stream is broken)");
    return;
  }
  // The rest waits for the socket (or for the writer holding it): the io thread writes it when
  // the socket takes more, so that no thread blocks on a peer that stopped reading.
  if (m.awaiting_write.exchange(true)) return;
  asio::post(m.hub->io, [self = shared_from_this()] { self->await_writable(); });
}

void Link::await_writable() {   // on the io thread
  auto& m = *impl_;
  m.socket.async_wait(tcp::socket::wait_write, [self = shared_from_this()](const boost::system::error_code& ec) {
    auto& im = *self->impl_;
    im.awaiting_write.store(false);
    if (ec || self->closed()) return;
    self->flush_some();
  });
}

// Never blocks: each link's outbox goes as far as its socket takes it now (Link::flush_some).
void flush_batched() {
  auto& b = batched();
  if (!b.any.load()) return;
  std::vector<std::shared_ptr<Link>> links;
  {
    std::lock_guard lk(b.mu);
    links.swap(b.links);
    b.any.store(false, std::memory_order_relaxed);
    for (auto& l : links) l->impl_->dirty = false;
  }
  for (auto& l : links) l->flush_some();
}

void Link::close(const std::string& why) {
  std::lock_guard lk(impl_->close_mu);
  if (impl_->close_reason.empty()) impl_->close_reason = why;
  if (closed_.exchange(true, std::memory_order_acq_rel)) return;
  // The read loop sees the end and runs the closed handler; a send blocked on the socket returns.
  if (impl_->fd_open) ::shutdown(impl_->fd, SHUT_RDWR);
}

namespace {

asio::awaitable<bool> read_frame(tcp::socket& s, std::uint32_t max, char& kind, std::uint8_t& flags,
                                 std::vector<char>& body) {
  boost::system::error_code ec;
  unsigned char h[6];
  co_await asio::async_read(s, asio::buffer(h, sizeof h), asio::redirect_error(asio::use_awaitable, ec));
  if (ec) co_return false;
  const auto size = parse_header(h, max, kind, flags);
  if (!size) co_return false;
  body.resize(*size);
  if (!body.empty()) {
    co_await asio::async_read(s, asio::buffer(body), asio::redirect_error(asio::use_awaitable, ec));
    if (ec) co_return false;
  }
  co_return true;
}

// A link's reader after the handshake: one read_some takes in whatever the socket holds (many
// small frames at once when calls or replies queue up), and frames are cut from that buffer. A
// body larger than the buffer is read straight into its own vector after the part already here.
class FrameReader {
 public:
  static constexpr std::size_t kBuffer = 64u << 10;
  explicit FrameReader(tcp::socket& s) : s_(s), buf_(kBuffer) {}

  // The next frame, or false at EOF, on an error or on a size over `max`.
  asio::awaitable<bool> next(std::uint32_t max, char& kind, std::uint8_t& flags, std::vector<char>& body) {
    if (!co_await fill(6)) co_return false;
    const auto parsed = parse_header(reinterpret_cast<const unsigned char*>(buf_.data() + begin_), max, kind, flags);
    if (!parsed) co_return false;
    begin_ += 6;
    const std::size_t size = *parsed;
    if (size <= kBuffer) {
      if (!co_await fill(size)) co_return false;
      body.assign(buf_.data() + begin_, buf_.data() + begin_ + size);
      begin_ += size;
      co_return true;
    }
    const std::size_t here = end_ - begin_;   // less than size: the buffer holds at most kBuffer
    body.resize(size);
    std::memcpy(body.data(), buf_.data() + begin_, here);
    begin_ = end_ = 0;
    boost::system::error_code ec;
    co_await asio::async_read(s_, asio::buffer(body.data() + here, size - here), asio::redirect_error(asio::use_awaitable, ec));
    co_return !ec;
  }

 private:
  // Until at least `want` (<= kBuffer) unread bytes are buffered.
  asio::awaitable<bool> fill(std::size_t want) {
    if (begin_ == end_) begin_ = end_ = 0;
    while (end_ - begin_ < want) {
      if (begin_ > 0 && buf_.size() - begin_ < want) {   // move what is left to the front
        std::memmove(buf_.data(), buf_.data() + begin_, end_ - begin_);
        end_ -= begin_;
        begin_ = 0;
      }
      boost::system::error_code ec;
      const std::size_t got = co_await s_.async_read_some(asio::buffer(buf_.data() + end_, buf_.size() - end_),
                                                          asio::redirect_error(asio::use_awaitable, ec));
      if (ec) co_return false;
      end_ += got;
    }
    co_return true;
  }

  tcp::socket& s_;
  std::vector<char> buf_;
  std::size_t begin_ = 0, end_ = 0;
};

asio::awaitable<bool> write_small(tcp::socket& s, char kind, const std::vector<char>& body) {
  std::vector<char> f(6 + body.size());
  put_header(f.data(), std::uint32_t(body.size()), kind, 0);
  std::copy(body.begin(), body.end(), f.begin() + 6);
  boost::system::error_code ec;
  co_await asio::async_write(s, asio::buffer(f), asio::redirect_error(asio::use_awaitable, ec));
  co_return !ec;
}

// The acceptor's side. Returns the peer's identity; throws ErrorException on a refusal.
asio::awaitable<PeerIdentity> accept_handshake(LinkHub::Impl& hub, tcp::socket& s) {
  const Nonce ns = fresh_nonce();
  if (!co_await write_small(s, kChallenge, std::vector<char>(ns.begin(), ns.end()))) {
    throw ErrorException(Error{NetCode::Unreachable, "the peer went away during the handshake"});
  }
  char kind = 0;
  std::uint8_t flags = 0;
  std::vector<char> body;
  if (!co_await read_frame(s, kMaxHandshakeFrame, kind, flags, body) || kind != kProof ||
      body.size() <= kNonce + kTag) {
    throw ErrorException(Error{NetCode::Refused, "no valid proof (not a troupe process?)"});
  }
  Nonce nc{};
  Tag given{};
  std::memcpy(nc.data(), body.data(), kNonce);
  std::memcpy(given.data(), body.data() + kNonce, kTag);
  std::vector<char> ident(body.begin() + kNonce + kTag, body.end());
  const Tag want = hub.hmac({Bytes(kConnectorRole), bytes(ns), bytes(nc), bytes(ident)});
  if (CRYPTO_memcmp(want.data(), given.data(), kTag) != 0) {
    co_await write_small(s, kRefusedFrame, {});
    throw ErrorException(Error{NetCode::Refused, "missing or wrong cluster token"});
  }
  PeerIdentity peer;
  try {
    peer = decode_identity(ident.data(), ident.size());
  } catch (const std::exception& e) {
    throw ErrorException(Error{NetCode::Refused, std::string("a malformed identity: ") + e.what()});
  }
  const Tag mine = hub.hmac({Bytes(kAcceptorRole), bytes(nc), bytes(ns), bytes(hub.self_bytes)});
  std::vector<char> answer(mine.begin(), mine.end());
  answer.insert(answer.end(), hub.self_bytes.begin(), hub.self_bytes.end());
  if (!co_await write_small(s, kAccepted, answer)) {
    throw ErrorException(Error{NetCode::Unreachable, "the peer went away during the handshake"});
  }
  co_return peer;
}

// The connector's side.
asio::awaitable<PeerIdentity> connect_handshake(LinkHub::Impl& hub, tcp::socket& s) {
  char kind = 0;
  std::uint8_t flags = 0;
  std::vector<char> body;
  if (!co_await read_frame(s, kMaxHandshakeFrame, kind, flags, body) || kind != kChallenge || body.size() != kNonce) {
    throw ErrorException(Error{NetCode::Refused, "no challenge: not a troupe link"});
  }
  Nonce ns{};
  std::memcpy(ns.data(), body.data(), kNonce);
  const Nonce nc = fresh_nonce();
  const Tag proof = hub.hmac({Bytes(kConnectorRole), bytes(ns), bytes(nc), bytes(hub.self_bytes)});
  std::vector<char> out(nc.begin(), nc.end());
  out.insert(out.end(), proof.begin(), proof.end());
  out.insert(out.end(), hub.self_bytes.begin(), hub.self_bytes.end());
  if (!co_await write_small(s, kProof, out)) {
    throw ErrorException(Error{NetCode::Unreachable, "the peer went away during the handshake"});
  }
  if (!co_await read_frame(s, kMaxHandshakeFrame, kind, flags, body)) {
    throw ErrorException(Error{NetCode::Refused, "the peer closed the handshake"});
  }
  if (kind == kRefusedFrame) throw ErrorException(Error{NetCode::Refused, "refused: missing or wrong cluster token"});
  if (kind != kAccepted || body.size() <= kTag) throw ErrorException(Error{NetCode::Refused, "a malformed answer"});
  std::vector<char> ident(body.begin() + kTag, body.end());
  const Tag want = hub.hmac({Bytes(kAcceptorRole), bytes(nc), bytes(ns), bytes(ident)});
  if (CRYPTO_memcmp(want.data(), body.data(), kTag) != 0) {
    throw ErrorException(Error{NetCode::Refused, "the peer does not hold the cluster token"});
  }
  try {
    co_return decode_identity(ident.data(), ident.size());
  } catch (const std::exception& e) {
    throw ErrorException(Error{NetCode::Refused, std::string("a malformed identity: ") + e.what()});
  }
}

// After an EOF: whether the peer's process has ended, waiting up to `patience` for it (a process
// that was killed closes its sockets a moment before its pid reads as ended).
asio::awaitable<bool> peer_ended(Link::Impl& m, std::chrono::milliseconds patience) {
  if (m.pidfd < 0) co_return false;
  pollfd p{m.pidfd, POLLIN, 0};
  if (::poll(&p, 1, 0) == 1) co_return true;
  const int fd = ::dup(m.pidfd);
  if (fd < 0) co_return false;
  auto pd = std::make_shared<asio::posix::stream_descriptor>(m.hub->io);
  boost::system::error_code ec;
  pd->assign(fd, ec);
  if (ec) {   // a pidfd this reactor cannot watch: the end stays Lost
    ::close(fd);
    co_return false;
  }
  asio::steady_timer limit(m.hub->io, patience);
  limit.async_wait([pd](const boost::system::error_code& e) {   // pd by value: it may fire after this returns
    if (!e) {
      boost::system::error_code ignored;
      pd->cancel(ignored);
    }
  });
  co_await pd->async_wait(asio::posix::descriptor_base::wait_read, asio::redirect_error(asio::use_awaitable, ec));
  limit.cancel();
  co_return !ec;
}

asio::awaitable<void> finish(std::shared_ptr<Link> link, Link::Impl& m, std::string why) {
  const bool here = link->closed();   // close() was called before the read loop saw the end
  link->close(why);   // shut down: a sender still in write_frame fails at once and lets go
  // The lane: what the peer published before its end is handled, as its socket's bytes were;
  // then nothing more is taken, and no thread runs the handlers any longer.
  if (m.peer_switched) Lane::end(m.lane, !here);
  boost::system::error_code ec;
  m.timer.cancel();
  std::string reason;
  bool frozen = false;
  {
    std::lock_guard wk(m.write_mu);   // no send is between its closed() check and its write now
    std::lock_guard lk(m.close_mu);
    m.fd_open = false;
    m.socket.close(ec);
    reason = m.close_reason;
    frozen = m.frozen;
  }
  LinkEnd end = frozen ? LinkEnd::Frozen : here ? LinkEnd::Closed : LinkEnd::Lost;
  // The pidfd's word is checked against /proc (a zombie, gone, or its pid reused): a peer seen
  // alive there is Lost, not Exited, whatever the descriptor said (a live peer once read as
  // Exited under load, in tests whose peer is this very process). Nothing here may keep the
  // closed handler from running: a failure to tell leaves the end Lost.
  // Not `end == Lost && co_await ...`: GCC 12 mishandles a co_await inside a short-circuit &&.
  // Here it awaited peer_ended although the left side was false, so every link closed here
  // waited out the 500 ms (each program's exit took 0.5 s longer); a minimal Asio program with
  // `false && co_await f()` crashes outright.
  try {
    if (end == LinkEnd::Lost) {
      const bool ended = co_await peer_ended(m, std::chrono::milliseconds(500));
      if (ended && peer_exited(link->peer())) {
        end = LinkEnd::Exited;
        reason += " (its process exited)";
      }
    }
  } catch (const std::exception& e) {
    spdlog::warn("links: whether the peer at {} exited is unknown: {}", link->address(), e.what());
  }
  auto handler = std::move(m.on_closed);
  m.on_message = nullptr;
  if (!handler) co_return;
  try {
    handler(*link, end, reason);
  } catch (const std::exception& e) {
    spdlog::error("links: the closed handler of the link to {} failed: {}", link->address(), e.what());
  }
}

// For co_spawn: an exception that ends a link's coroutine is logged (asio::detached would drop it
// without a word, and the link would end unseen).
auto log_exception(const char* what) {
  return [what](const std::exception_ptr& e) {
    if (!e) return;
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      spdlog::error("links: {} ended by an exception: {}", what, x.what());
    } catch (...) {
      spdlog::error("links: {} ended by an exception", what);
    }
  };
}

}  // namespace

// Runs on the io thread for the link's lifetime: reads messages, joins chunks, hands them over.
struct LinkLoops {
  static asio::awaitable<void> read(std::shared_ptr<Link> link) {
    auto& m = *link->impl_;
    char kind = 0;
    std::uint8_t flags = 0;
    std::vector<char> body;
    Reassembly joined;
    std::string why = "the peer closed the link";
    try {   // whatever happens, the link ends through finish() and its closed handler runs
      FrameReader reader(m.socket);
      while (co_await reader.next(kMaxChunk, kind, flags, body)) {
        m.last_heard.store(now_ns(), std::memory_order_relaxed);
        if (internal_kind(kind)) {
          why = own_message(link, kind, flags, body);
          if (!why.empty()) break;
          continue;
        }
        if (m.peer_switched) { why = "a message on the socket after the peer moved to its lane"; break; }
        std::vector<char>* message = nullptr;
        try {
          message = joined.feed(kind, flags, body);
        } catch (const std::runtime_error& e) {
          why = e.what();
          break;
        }
        if (message == nullptr) continue;
        m.hub->received.fetch_add(1, std::memory_order_relaxed);
        try {
          if (m.on_message) m.on_message(*link, kind, *message);
        } catch (const std::exception& e) {   // a bad message from the peer: this link ends
          why = std::string("a message was refused: ") + e.what();
          break;
        }
        if (message->capacity() > 4 * std::size_t(kMaxChunk)) std::vector<char>().swap(*message);   // a big one passed
        if (link->closed()) break;
      }
      if (why.empty()) why = "the peer closed the link";
    } catch (const std::exception& e) {
      why = std::string("the read loop failed: ") + e.what();
    }
    co_await finish(link, m, why);
  }

  // A link's own message on the socket (heartbeat, lane offer, refusal, switch, doorbell): ""
  // when taken, else why the link ends. On the io thread.
  static std::string own_message(const std::shared_ptr<Link>& link, char kind, std::uint8_t flags, const std::vector<char>& body) {
    auto& m = *link->impl_;
    if (kind == kHeartbeat) return "";
    if (flags != 0) return "a link's own message in chunks";
    switch (kind) {
      case kLaneOffer: return take_offer(link, body);
      case kLaneRefused:
        if (!m.offerer || m.peer_switched || m.lane_on.load()) return "a lane refused that was not offered";
        {
          std::lock_guard lk(m.write_mu);
          m.lane.reset();   // the offer's file goes with it: messages stay on the socket
        }
        return "";
      case kLaneSwitch:
        if (!m.lane || m.peer_switched || !body.empty() || (!m.offerer && !m.lane_on.load())) return "a switch to no lane";
        m.peer_switched = true;
        Lane::open(m.lane);
        Lane::drain(*m.lane);
        Lane::hand_off(m.lane);
        if (m.offerer) {   // the acceptor has switched: this side follows, and the file has been opened
          m.lane->map->close_fd();
          m.switch_due.store(true);
          Lane::switch_to_lane(*link);
        }
        return "";
      case kDoorbell:
        if (!m.peer_switched) return "a doorbell with no lane";
        m.lane->in.control().rung.store(0);   // seq_cst, then the drain's look: see lane::Producer::put
        Lane::drain(*m.lane);
        Lane::hand_off(m.lane);   // the rest after this thread's other work
        return "";
      default: return "an unknown link message " + std::to_string(int(static_cast<unsigned char>(kind)));
    }
  }

  // Offer (connector): a fresh lane file for the peer to open, as the link's first message.
  static void offer_lane(const std::shared_ptr<Link>& link) {
    auto& m = *link->impl_;
    if (!m.hub->lanes || m.pidfd < 0) return;   // another host (or a peer whose pid is unsure)
    try {
      auto map = lane::Mapping::create(lane::kCapacity);
      std::vector<char> body(4 + 8 + map->magic().size());
      put_le<std::uint32_t>(body.data(), std::uint32_t(map->fd()));
      put_le<std::uint64_t>(body.data() + 4, map->capacity());
      std::memcpy(body.data() + 12, map->magic().data(), map->magic().size());
      m.lane = std::make_shared<Lane>(std::move(map), true, link);
      m.offerer = true;
      std::lock_guard lk(m.write_mu);
      m.write_frame(kLaneOffer, 0, body.data(), body.size(), true);   // a failure shows as the link's end
    } catch (const std::exception& e) {
      spdlog::debug("links: no lane to {}: {}", link->address(), e.what());
      m.lane.reset();
      m.offerer = false;
    }
  }

  // Acceptor: opens the offered file and switches to it, or refuses (messages stay on the socket).
  static std::string take_offer(const std::shared_ptr<Link>& link, const std::vector<char>& body) {
    auto& m = *link->impl_;
    if (m.offerer || m.lane) return "a second lane offer";
    lane::Magic magic{};
    if (body.size() != 12 + magic.size()) return "a malformed lane offer";
    const auto fd = get_le<std::uint32_t>(body.data());
    const auto cap = get_le<std::uint64_t>(body.data() + 4);
    std::memcpy(magic.data(), body.data() + 12, magic.size());
    if (m.hub->lanes && m.pidfd >= 0 && fd <= std::uint32_t(INT32_MAX)) {
      try {
        m.lane = std::make_shared<Lane>(lane::Mapping::open(link->peer().pid, int(fd), magic, cap), false, link);
      } catch (const std::exception& e) {
        spdlog::debug("links: the lane {} offered is refused: {}", link->address(), e.what());
      }
    }
    if (m.lane) {
      m.switch_due.store(true);
      Lane::switch_to_lane(*link);
      return "";
    }
    std::lock_guard lk(m.write_mu);
    m.write_frame(kLaneRefused, 0, nullptr, 0, true);
    return "";
  }

  static asio::awaitable<void> beat(std::shared_ptr<Link> link) {
    auto& m = *link->impl_;
    const auto& o = m.hub->opts;
    boost::system::error_code ec;
    while (!link->closed()) {
      m.timer.expires_after(o.heartbeat / 2);
      co_await m.timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
      if (link->closed()) break;
      if (m.peer_switched) {
        // The peer publishing in the lane is the peer heard, taken or not (its only taker may be
        // busy in one long handler). And a frame no thread took (a watcher blocked in a send,
        // say, so that no doorbell rang) waits at most this long.
        const std::uint64_t published = m.lane->in.published();
        if (published != m.lane_heard) {
          m.lane_heard = published;
          m.last_heard.store(now_ns(), std::memory_order_relaxed);
        }
        Lane::drain(*m.lane);
        Lane::hand_off(m.lane);
      }
      const std::int64_t now = now_ns();
      const auto silence = std::chrono::nanoseconds(now - m.last_heard.load(std::memory_order_relaxed));
      if (silence > o.silence_limit) {
        {
          std::lock_guard lk(m.close_mu);
          m.frozen = true;
        }
        link->close("the peer was silent for " + std::to_string(o.silence_limit.count()) + " ms");
        break;
      }
      if (std::chrono::nanoseconds(now - m.last_sent.load(std::memory_order_relaxed)) >= o.heartbeat) {
        std::unique_lock lk(m.write_mu, std::try_to_lock);   // busy: a frame is going out anyway
        if (lk.owns_lock() && !m.write_frame(kHeartbeat, 0, nullptr, 0, false)) link->close("a heartbeat failed");
      }
    }
  }

  static void start(const std::shared_ptr<Link>& link) {
    auto& io = link->impl_->hub->io;
    asio::co_spawn(io, read(link), log_exception("a link's read loop"));
    asio::co_spawn(io, beat(link), log_exception("a link's heartbeat"));
  }

  static std::shared_ptr<Link> make(const std::shared_ptr<LinkHub::Impl>& hub, tcp::socket s, PeerIdentity peer) {
    boost::system::error_code ec;
    s.set_option(tcp::no_delay(true), ec);
    auto ep = s.remote_endpoint(ec);
    auto link = std::shared_ptr<Link>(new Link(std::make_unique<Link::Impl>(hub, std::move(s))));
    if (peer.host == hub->self.host && peer.pid != 0) {   // watch the peer's pid, if it is the one that spoke
      int fd = int(::syscall(SYS_pidfd_open, pid_t(peer.pid), 0));
      if (fd >= 0 && process_start_time(peer.pid) == peer.start_time) link->impl_->pidfd = fd;
      else if (fd >= 0) ::close(fd);
    }
    link->peer_ = std::move(peer);
    link->address_ = ec ? "?" : ep.address().to_string() + ":" + std::to_string(ep.port());
    return link;
  }
};

// ---- LinkHub ------------------------------------------------------------------------------------

LinkHub::LinkHub(std::string token, PeerIdentity self, LinkOptions options)
    : impl_(std::make_shared<Impl>(std::move(token), std::move(self), options)) {
  auto ran = std::make_shared<std::promise<void>>();
  impl_->ran = ran->get_future();
  impl_->thread = std::thread([impl = impl_, ran] {
    impl->serve();
    ran->set_value();
  });
}

LinkHub::~LinkHub() { stop(); }

const PeerIdentity& LinkHub::self() const { return impl_->self; }

LinkHub::Counts LinkHub::counts() const {
  return Counts{impl_->sent.load(std::memory_order_relaxed), impl_->received.load(std::memory_order_relaxed)};
}

namespace {

asio::awaitable<void> accept_one(std::shared_ptr<LinkHub::Impl> hub, tcp::socket s) {
  boost::system::error_code ec;
  auto peer_ep = s.remote_endpoint(ec);
  std::string who = ec ? "?" : peer_ep.address().to_string() + ":" + std::to_string(peer_ep.port());
  asio::steady_timer deadline(hub->io);
  deadline.expires_after(hub->opts.handshake_timeout);
  deadline.async_wait([&s](const boost::system::error_code& e) {
    if (!e) {
      boost::system::error_code ignored;
      s.close(ignored);   // a peer that never finishes the handshake is dropped
    }
  });
  PeerIdentity peer;
  try {
    peer = co_await accept_handshake(*hub, s);
  } catch (const ErrorException& e) {
    deadline.cancel();
    spdlog::warn("links: refused {}: {}", who, e.error().message);
    co_return;
  }
  deadline.cancel();
  if (!s.is_open()) co_return;
  auto link = LinkLoops::make(hub, std::move(s), std::move(peer));
  {
    std::lock_guard lk(hub->mu);
    if (hub->stopping) co_return;
  }
  hub->remember(link);
  if (hub->on_accept) hub->on_accept(link);
  LinkLoops::start(link);
}

asio::awaitable<void> accept_loop(std::shared_ptr<LinkHub::Impl> hub) {
  for (;;) {
    boost::system::error_code ec;
    tcp::socket s = co_await hub->acceptor->async_accept(asio::redirect_error(asio::use_awaitable, ec));
    if (ec == asio::error::operation_aborted || !hub->acceptor->is_open()) co_return;
    if (ec) {   // out of descriptors, say: back off, keep serving (not a poll: a failure's pause)
      asio::steady_timer pause(hub->io, std::chrono::milliseconds(50));
      co_await pause.async_wait(asio::redirect_error(asio::use_awaitable, ec));
      continue;
    }
    asio::co_spawn(hub->io, accept_one(hub, std::move(s)), log_exception("an accepted link's handshake"));
  }
}

}  // namespace

std::string LinkHub::listen(const std::string& bind, AcceptHandler on_accept) {
  auto& m = *impl_;
  std::promise<std::string> result;
  auto f = result.get_future();
  asio::post(m.io, [&] {
    try {
      boost::system::error_code ec;
      auto addr = asio::ip::make_address(bind, ec);
      if (ec) throw ErrorException(Error{NetCode::Unreachable, "links: cannot listen on '" + bind + "': " + ec.message()});
      auto acc = std::make_unique<tcp::acceptor>(m.io);
      tcp::endpoint ep(addr, 0);
      acc->open(ep.protocol(), ec);
      if (!ec) acc->set_option(tcp::acceptor::reuse_address(true), ec);
      if (!ec) acc->bind(ep, ec);
      if (!ec) acc->listen(asio::socket_base::max_listen_connections, ec);
      if (ec) throw ErrorException(Error{NetCode::Unreachable, "links: cannot listen on " + bind + ": " + ec.message()});
      std::string address = bind + ":" + std::to_string(acc->local_endpoint().port());
      m.acceptor = std::move(acc);
      m.on_accept = std::move(on_accept);
      asio::co_spawn(m.io, accept_loop(impl_), log_exception("the accept loop"));
      result.set_value(address);
    } catch (...) {
      result.set_exception(std::current_exception());
    }
  });
  return f.get();
}

std::shared_ptr<Link> LinkHub::connect(const std::string& address, Link::MessageHandler on_message,
                                       Link::ClosedHandler on_closed, std::chrono::milliseconds timeout) {
  std::string host;
  std::uint16_t port = 0;
  try {
    std::tie(host, port) = split_address(address);
  } catch (const std::invalid_argument& e) {
    throw ErrorException(Error{NetCode::Unreachable, e.what()});
  }
  auto hub = impl_;
  struct Attempt {
    explicit Attempt(asio::io_context& io) : socket(io), deadline(io) {}
    tcp::socket socket;
    asio::steady_timer deadline;
    std::promise<PeerIdentity> done;
  };
  auto at = std::make_shared<Attempt>(hub->io);
  auto f = at->done.get_future();
  asio::co_spawn(hub->io, [hub, at, host, port, timeout]() -> asio::awaitable<void> {
    at->deadline.expires_after(timeout);
    at->deadline.async_wait([at](const boost::system::error_code& e) {
      if (!e) {
        boost::system::error_code ignored;
        at->socket.close(ignored);
      }
    });
    try {
      boost::system::error_code ec;
      tcp::resolver resolver(hub->io);
      auto found = co_await resolver.async_resolve(host, std::to_string(port), asio::redirect_error(asio::use_awaitable, ec));
      if (ec) throw ErrorException(Error{NetCode::Unreachable, "cannot resolve " + host + ": " + ec.message()});
      co_await asio::async_connect(at->socket, found, asio::redirect_error(asio::use_awaitable, ec));
      if (ec) throw ErrorException(Error{NetCode::Unreachable, "cannot reach " + host + ":" + std::to_string(port) + ": " + ec.message()});
      at->socket.set_option(tcp::no_delay(true), ec);
      PeerIdentity peer = co_await connect_handshake(*hub, at->socket);
      at->deadline.cancel();
      if (!at->socket.is_open()) throw ErrorException(Error{NetCode::Unreachable, "the handshake timed out"});
      at->done.set_value(std::move(peer));
    } catch (const ErrorException& e) {
      at->deadline.cancel();
      Error err = e.error();
      if (!at->socket.is_open() && err.code == NetCode::Refused) err = Error{NetCode::Unreachable, "the handshake timed out"};
      at->done.set_exception(std::make_exception_ptr(ErrorException(err)));
    } catch (const std::exception& e) {
      at->deadline.cancel();
      at->done.set_exception(std::make_exception_ptr(ErrorException(Error{NetCode::Unreachable, e.what()})));
    }
  }, log_exception("a link's connect"));
  if (f.wait_for(timeout + std::chrono::seconds(1)) != std::future_status::ready) {
    asio::post(hub->io, [at] {
      boost::system::error_code ignored;
      at->socket.close(ignored);
    });
    f.wait();
  }
  PeerIdentity peer = f.get();   // throws the attempt's ErrorException
  // The link is made and started on the io thread, so that no read begins before its handlers exist.
  auto made = std::make_shared<std::promise<std::shared_ptr<Link>>>();
  auto mf = made->get_future();
  asio::post(hub->io, [hub, at, made, address, peer = std::move(peer), on_message = std::move(on_message),
                       on_closed = std::move(on_closed)]() mutable {
    auto link = LinkLoops::make(hub, std::move(at->socket), std::move(peer));
    link->address_ = address;
    link->set_handlers(std::move(on_message), std::move(on_closed));
    hub->remember(link);
    LinkLoops::offer_lane(link);   // its first message, if the peer is on this host
    LinkLoops::start(link);
    made->set_value(link);
  });
  if (mf.wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
    throw ErrorException(Error{NetCode::Unreachable, "links: this process is stopping its links"});
  }
  return mf.get();
}

void LinkHub::stop() {
  auto& m = *impl_;
  std::vector<std::shared_ptr<Link>> open;
  {
    std::lock_guard lk(m.mu);
    if (m.stopping) return;
    m.stopping = true;
    for (auto& w : m.links) {
      if (auto l = w.lock()) open.push_back(std::move(l));
    }
    m.links.clear();
  }
  asio::post(m.io, [&m] {
    boost::system::error_code ec;
    if (m.acceptor) m.acceptor->close(ec);
  });
  for (auto& l : open) {
    l->flush_some();   // batched messages still in an outbox go now, as far as the socket takes them
    l->close("this process is stopping its links");
  }
  open.clear();
  m.work.reset();
  // The read loops see their links end and return; the io thread then runs out of work. Bounded:
  // a handler that never returns would hold it, so stop() stops waiting for it after a while.
  if (m.ran.valid() && m.ran.wait_for(std::chrono::seconds(5)) != std::future_status::ready) m.io.stop();
  if (m.thread.joinable()) m.thread.join();
}

}  // namespace troupe::net
