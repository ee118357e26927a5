#include "cluster/call_channel.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "troupe/net/address.hpp"
#include "troupe/net/frames.hpp"
#include "troupe/net/token.hpp"

namespace troupe::cluster {
namespace {

constexpr std::size_t kMaxConnections = 256;
constexpr auto kHandshakeTimeout = std::chrono::seconds(5);
// A peer that stops reading (frozen, partitioned) blocks a write at most this long; the
// connection is then given up (the caller's calls go through the middleman, see ClusterClient).
constexpr auto kSendTimeout = std::chrono::seconds(10);

}  // namespace

// ---- worker side ----------------------------------------------------------------------------

struct CallServer::Connection : detail::ReplySink {
  int fd;
  std::string peer;
  std::mutex write_mu;
  std::atomic<bool> done{false};

  Connection(int f, std::string p) : fd(f), peer(std::move(p)) {}
  ~Connection() override { ::close(fd); }

  void reply(const detail::WireReply& r) override {
    std::vector<char> frame;
    try {
      frame = net::encode_reply(r);
    } catch (const std::length_error&) {   // a result over 4 GiB of msgpack: an error instead
      net::ReplyFrame e;
      e.actor_id = r.actor_id;
      e.incarnation = r.incarnation;
      e.seq = r.seq;
      e.set_error(Error{ErrorCode::MethodFailed, "the result is too large for one reply (over 4 GiB of encoded bytes)"});
      frame = net::encode_reply(e);
    }
    std::lock_guard lk(write_mu);
    // A caller that went away (or stopped reading past kSendTimeout) misses its reply; a partial
    // frame would desynchronise the stream, so the connection ends and the caller sees it break.
    if (!net::write_all(fd, frame.data(), frame.size())) ::shutdown(fd, SHUT_RDWR);
  }
};

CallServer::CallServer(std::string token, const std::string& bind) : token_(std::move(token)) {
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) throw std::runtime_error(std::string("call server: socket: ") + std::strerror(errno));
  int one = 1;
  ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = 0;
  if (::inet_pton(AF_INET, bind.c_str(), &addr.sin_addr) != 1 ||
      ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(listen_fd_, 64) != 0) {
    int err = errno;
    ::close(listen_fd_);
    throw std::runtime_error("call server: cannot listen on " + bind + ": " + std::strerror(err));
  }
  socklen_t len = sizeof addr;
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  address_ = bind + ":" + std::to_string(ntohs(addr.sin_port));
  acceptor_ = std::thread([this] { accept_loop(); });
}

CallServer::~CallServer() { stop(); }

void CallServer::add(std::uint64_t actor_id, std::uint64_t incarnation, caf::actor host) {
  std::lock_guard lk(mu_);
  hosts_[actor_id] = {std::move(host), incarnation};
}

void CallServer::remove(std::uint64_t actor_id) {
  std::lock_guard lk(mu_);
  hosts_.erase(actor_id);
}

caf::actor CallServer::find(std::uint64_t actor_id, std::uint64_t incarnation) const {
  std::lock_guard lk(mu_);
  auto it = hosts_.find(actor_id);
  return it != hosts_.end() && it->second.second == incarnation ? it->second.first : caf::actor{};
}

void CallServer::stop() {
  std::vector<std::pair<std::thread, std::shared_ptr<Connection>>> conns;
  {
    std::lock_guard lk(mu_);
    if (stopping_) return;
    stopping_ = true;
    conns.swap(conns_);
    hosts_.clear();
  }
  ::shutdown(listen_fd_, SHUT_RDWR);
  if (acceptor_.joinable()) acceptor_.join();
  ::close(listen_fd_);
  for (auto& [t, c] : conns) ::shutdown(c->fd, SHUT_RDWR);
  for (auto& [t, c] : conns) t.join();
}

void CallServer::accept_loop() {
  for (;;) {
    sockaddr_in peer{};
    socklen_t len = sizeof peer;
    int fd = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&peer), &len, SOCK_CLOEXEC);
    if (fd < 0) {
      int err = errno;
      if (err == EINTR || err == ECONNABORTED) continue;
      {
        std::lock_guard lk(mu_);
        if (stopping_) return;
      }
      if (err == EMFILE || err == ENFILE) {   // out of descriptors: back off, keep serving
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        continue;
      }
      spdlog::error("call server {}: accept: {}", address_, std::strerror(err));
      return;
    }
    char ip[INET_ADDRSTRLEN] = "?";
    ::inet_ntop(AF_INET, &peer.sin_addr, ip, sizeof ip);
    auto conn = std::make_shared<Connection>(fd, std::string(ip) + ":" + std::to_string(ntohs(peer.sin_port)));
    std::lock_guard lk(mu_);
    if (stopping_) return;
    // Reap finished connections; refuse beyond the cap (a flood of idle peers costs no thread).
    for (auto it = conns_.begin(); it != conns_.end();) {
      if (it->second->done) { it->first.join(); it = conns_.erase(it); } else ++it;
    }
    if (conns_.size() >= kMaxConnections) {
      spdlog::warn("call server {}: refusing {}: {} connections open", address_, conn->peer, conns_.size());
      continue;   // conn's destructor closes it
    }
    conns_.emplace_back(std::thread([this, conn] {
                          serve(conn);
                          ::shutdown(conn->fd, SHUT_RDWR);   // the peer sees the end now; the fd
                          conn->done = true;                  // closes with the last reply sink
                        }),
                        conn);
  }
}

void CallServer::serve(const std::shared_ptr<Connection>& conn) {
  char kind = 0;
  std::vector<char> body;
  net::set_recv_timeout(conn->fd, kHandshakeTimeout);
  if (!net::read_frame(conn->fd, net::kMaxHandshakeFrame, kind, body) || kind != net::kHelloFrame) {
    spdlog::warn("call server {}: {} sent no handshake; closed", address_, conn->peer);
    return;
  }
  if (!net::token_matches(std::string(body.begin(), body.end()), token_)) {
    spdlog::warn("call server {}: refused {}: missing or wrong cluster token", address_, conn->peer);
    auto f = net::small_frame(net::kRefusedFrame, "refused: missing or wrong cluster token");
    net::write_all(conn->fd, f.data(), f.size());
    return;
  }
  net::set_recv_timeout(conn->fd, std::chrono::milliseconds(0));
  net::set_send_timeout(conn->fd, kSendTimeout);   // a caller that stops reading loses its connection
  net::set_nodelay(conn->fd);
  {
    auto f = net::small_frame(net::kOkFrame, "");
    std::lock_guard lk(conn->write_mu);
    if (!net::write_all(conn->fd, f.data(), f.size())) return;
  }
  while (net::read_frame(conn->fd, net::kMaxFrame, kind, body)) {
    detail::WireCall call;
    try {
      if (kind != net::kCallFrame) throw std::runtime_error(std::string("unexpected frame kind ") + std::to_string(int(kind)));
      static_cast<net::CallFrame&>(call) = net::decode_call(body.data(), body.size());
    } catch (const std::exception& e) {
      spdlog::warn("call server {}: closing {}: {}", address_, conn->peer, e.what());
      return;
    }
    call.token = token_;   // presented once, at the handshake
    if (auto host = find(call.actor_id, call.incarnation)) {
      caf::anon_send(host, detail::ChannelCall{std::move(call), conn});
      continue;
    }
    detail::WireReply r;   // FT-2: not here, or another incarnation
    r.actor_id = call.actor_id;
    r.incarnation = call.incarnation;
    r.seq = call.seq;
    r.set_error(Error{ErrorCode::ActorDied, "actor " + std::to_string(call.actor_id) + " incarnation " +
                                                std::to_string(call.incarnation) + " is not hosted here"});
    conn->reply(r);
  }
}

// ---- caller side ----------------------------------------------------------------------------

std::shared_ptr<CallChannel> CallChannel::open(const std::string& address, const std::string& token,
                                               ReplyHandler on_reply, BrokenHandler on_broken,
                                               std::chrono::milliseconds timeout) {
  std::string host;
  std::uint16_t port = 0;
  try {
    std::tie(host, port) = net::split_address(address);
  } catch (const std::invalid_argument& e) {
    spdlog::warn("call channel: {}", e.what());
    return nullptr;
  }
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0 || res == nullptr) {
    spdlog::warn("call channel: cannot resolve {}", address);
    return nullptr;
  }
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  bool ok = fd >= 0;
  if (ok) {   // a bounded connect: non-blocking, then poll
    int flags = ::fcntl(fd, F_GETFL);
    ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
    int rc = ::connect(fd, res->ai_addr, res->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      int err = 0;
      socklen_t len = sizeof err;
      rc = ::poll(&p, 1, int(timeout.count())) == 1 && ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 &&
                   err == 0 ? 0 : -1;
    }
    ::fcntl(fd, F_SETFL, flags);
    ok = rc == 0;
  }
  ::freeaddrinfo(res);
  char kind = 0;
  std::vector<char> body;
  if (ok) {
    net::set_nodelay(fd);
    net::set_recv_timeout(fd, timeout);
    auto hello = net::small_frame(net::kHelloFrame, token);
    ok = net::write_all(fd, hello.data(), hello.size()) && net::read_frame(fd, net::kMaxHandshakeFrame, kind, body);
  }
  if (!ok || kind != net::kOkFrame) {
    if (ok) spdlog::warn("call channel: {} refused: {}", address, std::string(body.begin(), body.end()));
    else spdlog::warn("call channel: cannot reach {}", address);
    if (fd >= 0) ::close(fd);
    return nullptr;
  }
  net::set_recv_timeout(fd, std::chrono::milliseconds(0));
  net::set_send_timeout(fd, kSendTimeout);
  std::shared_ptr<CallChannel> ch(new CallChannel(fd, std::move(on_reply), std::move(on_broken)));
  // The reader keeps its channel alive: a reply handler may drop every other reference.
  ch->reader_ = std::thread([self = ch] { self->read_loop(); });
  return ch;
}

CallChannel::CallChannel(int fd, ReplyHandler on_reply, BrokenHandler on_broken)
    : fd_(fd), on_reply_(std::move(on_reply)), on_broken_(std::move(on_broken)) {}

CallChannel::~CallChannel() {
  close();
  if (reader_.joinable()) reader_.detach();   // destroyed by its own reader, on its way out
  ::close(fd_);
}

bool CallChannel::send(const detail::WireCall& c) {
  std::vector<char> frame;
  try {
    frame = net::encode_call(c);
  } catch (const std::length_error&) {
    return false;   // too large for a frame: the middleman takes it
  }
  std::lock_guard lk(write_mu_);
  if (broken_) return false;
  if (!net::write_all(fd_, frame.data(), frame.size())) broken_ = true;
  // A partial write leaves the stream unusable: broken either way, and the reader sees EOF.
  if (broken_) ::shutdown(fd_, SHUT_RDWR);
  return !broken_;
}

bool CallChannel::broken() const {
  std::lock_guard lk(write_mu_);
  return broken_;
}

void CallChannel::close() {
  {
    std::lock_guard lk(write_mu_);
    broken_ = true;
    closed_ = true;
  }
  ::shutdown(fd_, SHUT_RDWR);
  if (reader_.joinable() && reader_.get_id() != std::this_thread::get_id()) reader_.join();
}

void CallChannel::read_loop() {
  char kind = 0;
  std::vector<char> body;
  while (net::read_frame(fd_, net::kMaxFrame, kind, body)) {
    detail::WireReply r;
    try {
      if (kind != net::kReplyFrame) throw std::runtime_error(std::string("unexpected frame kind ") + std::to_string(int(kind)));
      static_cast<net::ReplyFrame&>(r) = net::decode_reply(body.data(), body.size());
    } catch (const std::exception& e) {
      spdlog::warn("call channel: {}; closing", e.what());
      break;
    }
    try {
      on_reply_(r);
    } catch (const std::exception& e) {   // a continuation threw: the channel goes on
      spdlog::error("call channel: a reply handler threw: {}", e.what());
    } catch (...) {
      spdlog::error("call channel: a reply handler threw");
    }
  }
  bool closed_here;
  {
    std::lock_guard lk(write_mu_);
    closed_here = closed_;
    broken_ = true;
    ::shutdown(fd_, SHUT_RDWR);
  }
  // Calls written on this connection will get no reply here: whoever owns them is told.
  if (on_broken_) on_broken_(this, closed_here);
}

}  // namespace troupe::cluster
