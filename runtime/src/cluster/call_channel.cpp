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
#include <msgpack.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "cluster/http.hpp"

namespace troupe::cluster {
namespace {

constexpr char kHello = 'H', kOk = 'O', kRefused = 'E', kCall = 'C', kReply = 'R';
constexpr std::uint32_t kMaxHandshakeFrame = 4096;          // before the token is checked
constexpr std::uint32_t kMaxFrame = 0xFFFFFFF0u;            // after: calls may carry big msgpack args
constexpr std::size_t kMaxConnections = 256;
constexpr auto kHandshakeTimeout = std::chrono::seconds(5);
// A peer that stops reading (frozen, partitioned) blocks a write at most this long; the
// connection is then given up (the caller's calls go through the middleman, see ClusterClient).
constexpr auto kSendTimeout = std::chrono::seconds(10);

// ---- socket helpers --------------------------------------------------------------------

bool write_all(int fd, const char* p, std::size_t n) {
  while (n > 0) {
    ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += w;
    n -= std::size_t(w);
  }
  return true;
}

bool read_exact(int fd, char* p, std::size_t n) {
  while (n > 0) {
    ssize_t r = ::recv(fd, p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;   // EOF, error, or a receive timeout
    p += r;
    n -= std::size_t(r);
  }
  return true;
}

// One frame's kind and body; false at EOF, on error, or when the length exceeds `max`.
bool read_frame(int fd, std::uint32_t max, char& kind, std::vector<char>& body) {
  unsigned char len[4];
  if (!read_exact(fd, reinterpret_cast<char*>(len), 4)) return false;
  std::uint32_t n = std::uint32_t(len[0]) | std::uint32_t(len[1]) << 8 | std::uint32_t(len[2]) << 16 |
                    std::uint32_t(len[3]) << 24;
  if (n == 0 || n > max) return false;
  body.resize(n - 1);
  return read_exact(fd, &kind, 1) && read_exact(fd, body.data(), body.size());
}

// A frame whose first 5 bytes are reserved for the header; fills them in.
// Throws std::length_error for a body the u32 length cannot describe (the caller falls back).
void seal(std::vector<char>& frame, char kind) {
  if (frame.size() - 4 > kMaxFrame) throw std::length_error("call channel: frame too large");
  std::uint32_t n = std::uint32_t(frame.size() - 4);
  for (int i = 0; i < 4; ++i) frame[i] = char((n >> (8 * i)) & 0xFF);
  frame[4] = kind;
}

std::vector<char> small_frame(char kind, const std::string& body) {
  std::vector<char> f(5 + body.size());
  std::copy(body.begin(), body.end(), f.begin() + 5);
  seal(f, kind);
  return f;
}

void set_nodelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

void set_timeout(int fd, int option, std::chrono::milliseconds t) {
  timeval tv{};
  tv.tv_sec = t.count() / 1000;
  tv.tv_usec = (t.count() % 1000) * 1000;
  ::setsockopt(fd, SOL_SOCKET, option, &tv, sizeof tv);
}
void set_recv_timeout(int fd, std::chrono::milliseconds t) { set_timeout(fd, SO_RCVTIMEO, t); }
void set_send_timeout(int fd, std::chrono::milliseconds t) { set_timeout(fd, SO_SNDTIMEO, t); }

// ---- msgpack bodies ----------------------------------------------------------------------

struct FrameBuffer {   // msgpack's write target: appends to a frame after its reserved header
  std::vector<char> bytes = std::vector<char>(5);
  void write(const char* p, std::size_t n) { bytes.insert(bytes.end(), p, p + n); }
};

void pack_bytes(msgpack::packer<FrameBuffer>& pk, const std::vector<char>& b) {
  pk.pack_bin(std::uint32_t(b.size()));
  pk.pack_bin_body(b.data(), std::uint32_t(b.size()));
}

void pack_byte_lists(msgpack::packer<FrameBuffer>& pk, const std::vector<std::vector<char>>& lists) {
  pk.pack_array(std::uint32_t(lists.size()));
  for (const auto& b : lists) pack_bytes(pk, b);
}

const msgpack::object* fields(const msgpack::object& o, std::uint32_t n) {
  if (o.type != msgpack::type::ARRAY || o.via.array.size != n) throw std::runtime_error("malformed frame");
  return o.via.array.ptr;
}

std::vector<char> bytes_of(const msgpack::object& o) {
  if (o.type != msgpack::type::BIN) throw std::runtime_error("malformed frame: expected bytes");
  return std::vector<char>(o.via.bin.ptr, o.via.bin.ptr + o.via.bin.size);
}

std::vector<std::vector<char>> byte_lists_of(const msgpack::object& o) {
  if (o.type != msgpack::type::ARRAY) throw std::runtime_error("malformed frame: expected a list");
  std::vector<std::vector<char>> out;
  out.reserve(o.via.array.size);
  for (std::uint32_t i = 0; i < o.via.array.size; ++i) out.push_back(bytes_of(o.via.array.ptr[i]));
  return out;
}

template <class T>
T as(const msgpack::object& o) {
  try {
    return o.as<T>();
  } catch (const msgpack::type_error&) {
    throw std::runtime_error("malformed frame: a field has the wrong type");
  }
}

msgpack::object_handle unpack(const char* data, std::size_t size) {
  static const msgpack::unpack_limit kLimits(/*array*/ 1u << 20, /*map*/ 16, /*str*/ 1u << 30,
                                             /*bin*/ 0xFFFFFFFFu, /*ext*/ 0, /*depth*/ 4);
  try {
    std::size_t off = 0;
    auto h = msgpack::unpack(data, size, off, nullptr, nullptr, kLimits);
    if (off != size) throw std::runtime_error("malformed frame: trailing bytes");
    return h;
  } catch (const std::runtime_error&) {
    throw;
  } catch (const std::exception& e) {   // msgpack's own errors (insufficient bytes, limits, ...)
    throw std::runtime_error(std::string("malformed frame: ") + e.what());
  }
}

}  // namespace

std::vector<char> encode_call(const detail::WireCall& c) {
  FrameBuffer buf;
  msgpack::packer<FrameBuffer> pk(buf);
  pk.pack_array(6);
  pk.pack(c.actor_id);
  pk.pack(c.incarnation);
  pk.pack(c.seq);
  pk.pack(c.method);
  pack_bytes(pk, c.args);
  pack_byte_lists(pk, c.tensors);
  seal(buf.bytes, kCall);
  return std::move(buf.bytes);
}

detail::WireCall decode_call(const char* data, std::size_t size) {
  auto h = unpack(data, size);
  const auto* f = fields(h.get(), 6);
  detail::WireCall c;
  c.actor_id = as<std::uint64_t>(f[0]);
  c.incarnation = as<std::uint64_t>(f[1]);
  c.seq = as<std::uint64_t>(f[2]);
  c.method = as<std::string>(f[3]);
  c.args = bytes_of(f[4]);
  c.tensors = byte_lists_of(f[5]);
  return c;
}

std::vector<char> encode_reply(const detail::WireReply& r) {
  FrameBuffer buf;
  msgpack::packer<FrameBuffer> pk(buf);
  pk.pack_array(7);
  pk.pack(r.actor_id);
  pk.pack(r.incarnation);
  pk.pack(r.seq);
  pk.pack(r.code);
  pk.pack(r.error);
  pack_bytes(pk, r.result);
  pack_byte_lists(pk, r.tensors);
  seal(buf.bytes, kReply);
  return std::move(buf.bytes);
}

detail::WireReply decode_reply(const char* data, std::size_t size) {
  auto h = unpack(data, size);
  const auto* f = fields(h.get(), 7);
  detail::WireReply r;
  r.actor_id = as<std::uint64_t>(f[0]);
  r.incarnation = as<std::uint64_t>(f[1]);
  r.seq = as<std::uint64_t>(f[2]);
  r.code = as<std::int32_t>(f[3]);
  r.error = as<std::string>(f[4]);
  r.result = bytes_of(f[5]);
  r.tensors = byte_lists_of(f[6]);
  return r;
}

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
      frame = encode_reply(r);
    } catch (const std::length_error&) {   // a result over 4 GiB of msgpack: an error instead
      detail::WireReply e{r.actor_id, r.incarnation, r.seq, static_cast<std::int32_t>(ErrorCode::MethodFailed),
                          "the result is too large for one reply (over 4 GiB of encoded bytes)", {}, {}, {}};
      frame = encode_reply(e);
    }
    std::lock_guard lk(write_mu);
    // A caller that went away (or stopped reading past kSendTimeout) misses its reply; a partial
    // frame would desynchronise the stream, so the connection ends and the caller sees it break.
    if (!write_all(fd, frame.data(), frame.size())) ::shutdown(fd, SHUT_RDWR);
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
  set_recv_timeout(conn->fd, kHandshakeTimeout);
  if (!read_frame(conn->fd, kMaxHandshakeFrame, kind, body) || kind != kHello) {
    spdlog::warn("call server {}: {} sent no handshake; closed", address_, conn->peer);
    return;
  }
  if (!token_matches(std::string(body.begin(), body.end()), token_)) {
    spdlog::warn("call server {}: refused {}: missing or wrong cluster token", address_, conn->peer);
    auto f = small_frame(kRefused, "refused: missing or wrong cluster token");
    write_all(conn->fd, f.data(), f.size());
    return;
  }
  set_recv_timeout(conn->fd, std::chrono::milliseconds(0));
  set_send_timeout(conn->fd, kSendTimeout);   // a caller that stops reading loses its connection
  set_nodelay(conn->fd);
  {
    auto f = small_frame(kOk, "");
    std::lock_guard lk(conn->write_mu);
    if (!write_all(conn->fd, f.data(), f.size())) return;
  }
  while (read_frame(conn->fd, kMaxFrame, kind, body)) {
    detail::WireCall call;
    try {
      if (kind != kCall) throw std::runtime_error(std::string("unexpected frame kind ") + std::to_string(int(kind)));
      call = decode_call(body.data(), body.size());
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
    r.code = static_cast<std::int32_t>(ErrorCode::ActorDied);
    r.error = "actor " + std::to_string(call.actor_id) + " incarnation " + std::to_string(call.incarnation) +
              " is not hosted here";
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
    std::tie(host, port) = split_address(address);
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
    set_nodelay(fd);
    set_recv_timeout(fd, timeout);
    auto hello = small_frame(kHello, token);
    ok = write_all(fd, hello.data(), hello.size()) && read_frame(fd, kMaxHandshakeFrame, kind, body);
  }
  if (!ok || kind != kOk) {
    if (ok) spdlog::warn("call channel: {} refused: {}", address, std::string(body.begin(), body.end()));
    else spdlog::warn("call channel: cannot reach {}", address);
    if (fd >= 0) ::close(fd);
    return nullptr;
  }
  set_recv_timeout(fd, std::chrono::milliseconds(0));
  set_send_timeout(fd, kSendTimeout);
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
    frame = encode_call(c);
  } catch (const std::length_error&) {
    return false;   // too large for a frame: the middleman takes it
  }
  std::lock_guard lk(write_mu_);
  if (broken_) return false;
  if (!write_all(fd_, frame.data(), frame.size())) broken_ = true;
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
  while (read_frame(fd_, kMaxFrame, kind, body)) {
    detail::WireReply r;
    try {
      if (kind != kReply) throw std::runtime_error(std::string("unexpected frame kind ") + std::to_string(int(kind)));
      r = decode_reply(body.data(), body.size());
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
