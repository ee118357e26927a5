// A link's life on its hub's io thread (link_impl.hpp): the read loop, the link's own messages on
// the socket (heartbeats, the lane's offer, refusal, switch and doorbell), the heartbeat, and the
// end (finish: the lane's last messages, how the link ended, the closed handler).
#include "link_impl.hpp"   // first: it includes <utility> before Boost.Asio

#include <poll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <cstring>

#include <spdlog/spdlog.h>

namespace troupe::net {

std::function<void(std::exception_ptr)> log_exception(const char* what) {
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

namespace {

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
  const bool here = link->closed();   // close() was called before the read loop saw the end (faulted: Lost)
  link->close(why);   // shut down: a sender still in write_frame fails at once and lets go
  // The lane: what the peer published before its end is handled, as its socket's bytes were;
  // then nothing more is taken, and no thread runs the handlers any longer.
  if (m.peer_switched) Lane::end(m.lane, !here);
  boost::system::error_code ec;
  m.timer.cancel();
  std::string reason;
  bool frozen = false, faulted = false;
  {
    std::lock_guard wk(m.write_mu);   // no send is between its closed() check and its write now
    std::lock_guard lk(m.close_mu);
    m.fd_open = false;
    m.socket.close(ec);
    reason = m.close_reason;
    frozen = m.frozen;
    faulted = m.faulted;
  }
  LinkEnd end = frozen ? LinkEnd::Frozen : here && !faulted ? LinkEnd::Closed : LinkEnd::Lost;
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

}  // namespace

asio::awaitable<void> LinkLoops::read(std::shared_ptr<Link> link) {
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

std::string LinkLoops::own_message(const std::shared_ptr<Link>& link, char kind, std::uint8_t flags, const std::vector<char>& body) {
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

void LinkLoops::offer_lane(const std::shared_ptr<Link>& link) {
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

std::string LinkLoops::take_offer(const std::shared_ptr<Link>& link, const std::vector<char>& body) {
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

asio::awaitable<void> LinkLoops::beat(std::shared_ptr<Link> link) {
  auto& m = *link->impl_;
  const auto& o = m.hub->opts;
  boost::system::error_code ec;
  std::int64_t last_tick = now_ns();
  bool waived = false;   // the last tick did not judge the silence (below)
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
    // A tick a heartbeat or more late: this io thread did not run meanwhile (its process was
    // stopped, the machine paused or starved it). What the peer sent then may wait unread, and a
    // peer in the same process (an embedded cluster's head, node and driver) sent nothing, having
    // stopped too: this tick sends its heartbeat and leaves the silence to the next one, half a
    // heartbeat on, by which time both ends' first ticks after the stall have been heard. Only one
    // tick in a row is waived, so a peer frozen while this thread is starved is still found.
    const bool late = std::chrono::nanoseconds(now - last_tick) >= o.heartbeat;
    last_tick = now;
    waived = late && !waived;
    const auto silence = std::chrono::nanoseconds(now - m.last_heard.load(std::memory_order_relaxed));
    if (!waived && silence > o.silence_limit) {
      {
        std::lock_guard lk(m.close_mu);
        m.frozen = true;
      }
      link->close("the peer was silent for " + std::to_string(o.silence_limit.count()) + " ms");
      break;
    }
    if (std::chrono::nanoseconds(now - m.last_sent.load(std::memory_order_relaxed)) >= o.heartbeat) {
      std::unique_lock lk(m.write_mu, std::try_to_lock);   // busy: a frame is going out anyway
      if (lk.owns_lock() && !m.write_frame(kHeartbeat, 0, nullptr, 0, false)) link->close_on_fault("a heartbeat failed");
    }
  }
}

void LinkLoops::start(const std::shared_ptr<Link>& link) {
  auto& io = link->impl_->hub->io;
  asio::co_spawn(io, read(link), log_exception("a link's read loop"));
  asio::co_spawn(io, beat(link), log_exception("a link's heartbeat"));
}

std::shared_ptr<Link> LinkLoops::make(const std::shared_ptr<LinkHub::Impl>& hub, tcp::socket s, PeerIdentity peer) {
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
}  // namespace troupe::net
