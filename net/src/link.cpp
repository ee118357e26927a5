#include <utility>   // first: Boost 1.74's awaitable.hpp uses std::exchange without including it

// A link's sending side and its hub (link_impl.hpp holds their state and names the other files).
#include "troupe/net/link.hpp"

#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <spdlog/spdlog.h>

#include "link_impl.hpp"
#include "troupe/error.hpp"
#include "troupe/net/address.hpp"

namespace troupe::net {
namespace {

// How long the io thread looks for more work after a handler before it parks (LinkHub::Impl::serve).
constexpr auto kLinger = std::chrono::microseconds(50);
// Batched messages (Send::Batched): bodies up to kBatchedBody wait in a link's outbox, which is
// written out whole once it holds kOutbox bytes, if nothing flushed it before.
constexpr std::size_t kBatchedBody = 16u << 10, kOutbox = 64u << 10;

}  // namespace

Batched& batched() {
  static Batched b;
  return b;
}

bool lanes_allowed(const LinkOptions& o) {
  const char* env = std::getenv("TROUPE_LINK_LANE");
  return o.lane && !(env != nullptr && std::string_view(env) == "0");
}

// ---- the hub ------------------------------------------------------------------------------------

void LinkHub::Impl::serve() {
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

void LinkHub::Impl::remember(const std::shared_ptr<Link>& l) {
  std::lock_guard lk(mu);
  std::erase_if(links, [](const std::weak_ptr<Link>& w) { return w.expired(); });
  links.push_back(l);
}
// ---- a link -------------------------------------------------------------------------------------

bool Link::Impl::write_frame(char kind, std::uint8_t flags, const char* data, std::size_t size, bool wait, std::uint64_t to) {
  if (!internal_kind(kind) && lane_on.load(std::memory_order_relaxed)) return lane_frame(kind, flags, data, size, to);
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

bool Link::Impl::lane_frame(char kind, std::uint8_t flags, const char* data, std::size_t size, std::uint64_t to) {
  char header[kFrameHeader];
  put_header(header, std::uint32_t(size), kind, flags);
  iovec iov[2] = {{header, sizeof header}, {const_cast<char*>(data), size}};
  const auto put = lane->out.put(iov, size > 0 ? 2 : 1, sizeof header + size, Clock::now() + hub->opts.send_timeout,
                                 self->closed_, to);
  if (put != lane::Producer::Put::Ok && put != lane::Producer::Put::Ring) return false;
  last_sent.store(now_ns(), std::memory_order_relaxed);
  // Published: the peer takes it even if the doorbell cannot go (its end of the link takes what
  // was published before the EOF), so the send succeeded either way.
  if (put == lane::Producer::Put::Ring && !write_frame(kDoorbell, 0, nullptr, 0, true)) {
    self->close_on_fault("a doorbell failed (the stream is broken)");
  }
  return true;
}

bool Link::Impl::write_outbox() {
  take_outbox();
  if (sending.empty()) return true;
  iovec iov{sending.data(), sending.size()};
  const bool ok = write_all(&iov, 1, true);
  sending.clear();
  return ok;
}

Link::Impl::Wrote Link::Impl::try_write_outbox() {
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

void Link::Impl::take_outbox() {
  std::lock_guard lk(out_mu);
  sending.swap(outbox);
}

void Link::Impl::queue_frame(char kind, const char* data, std::size_t size) {
  char header[6];
  put_header(header, std::uint32_t(size), kind, 0);
  outbox.insert(outbox.end(), header, header + sizeof header);
  outbox.insert(outbox.end(), data, data + size);
}

bool Link::Impl::write_all(iovec* iov, int parts, bool wait) {
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

bool Link::send(char kind, const std::vector<char>& body, Send how, std::uint64_t to) {
  return send(kind, body.data(), body.size(), how, to);
}

bool Link::send(char kind, const char* data, std::size_t size, Send how, std::uint64_t to) {
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
    if (m.write_frame(kind, 0, data, size, true, to)) return true;
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
        ok = !closed() && m.write_frame(kind, flags, head.data(), head.size(), true, to);
      } else {
        ok = !closed() && m.write_frame(kind, flags, data + off, n, true, to);
      }
      off += n;
    }
    bulk.unlock();
    if (m.switch_due.load()) Lane::switch_to_lane(*this);   // due while this message went out
    if (ok) return true;
  }
  close_on_fault("a send failed or timed out (the peer stopped reading)");
  return false;
}

void Link::flush() {
  auto& m = *impl_;
  std::lock_guard lk(m.write_mu);
  if (closed()) return;
  if (!m.write_outbox()) close_on_fault("a send failed or timed out (the peer stopped reading)");
}

void Link::flush_some() {
  auto& m = *impl_;
  if (closed()) return;
  const auto wrote = m.try_write_outbox();
  if (wrote == Impl::Wrote::All) return;
  if (wrote == Impl::Wrote::Broken) {
    close_on_fault("a send failed (the stream is broken)");
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

void Link::close_on_fault(const std::string& why) {
  {
    std::lock_guard lk(impl_->close_mu);
    if (!closed()) impl_->faulted = true;
  }
  close(why);
}

void Link::close(const std::string& why) {
  std::lock_guard lk(impl_->close_mu);
  if (impl_->close_reason.empty()) impl_->close_reason = why;
  if (closed_.exchange(true, std::memory_order_acq_rel)) return;
  // The read loop sees the end and runs the closed handler; a send blocked on the socket returns.
  if (impl_->fd_open) ::shutdown(impl_->fd, SHUT_RDWR);
}

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
  // cancel() cannot take back a handler already queued as expired (the peer's bytes or EOF and the
  // timer fired in one pass of the reactor): it runs after this coroutine, and `s` with it, ended.
  // So it touches the socket only while the handshake is on (one io thread: no race on the flag).
  auto over = std::make_shared<bool>(false);
  struct Over {
    std::shared_ptr<bool> flag;
    ~Over() { *flag = true; }
  } mark_over{over};
  deadline.async_wait([&s, over](const boost::system::error_code& e) {
    if (!e && !*over) {
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
  *over = true;
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
