#include "troupe/net/http.hpp"
#include "troupe/net/token.hpp"

#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/http/buffer_body.hpp>
#include <boost/beast/http/file_body.hpp>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <condition_variable>
#include <cstdio>
#include <limits>
#include <algorithm>
#include <list>

namespace troupe::net {
namespace beast = boost::beast;
namespace bhttp = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

namespace {

constexpr std::size_t kBodyLimit = 64u << 20;
// "No limit" for a parser whose body something else bounds. Not boost::none: Beast 1.81 compares
// a content length with the optional limit, and any length is greater than an empty one.
constexpr std::uint64_t kNoLimit = std::numeric_limits<std::uint64_t>::max();
constexpr std::size_t kMaxConnections = 512;
constexpr std::chrono::seconds kIdleTimeout{120};

void set_socket_timeouts(int fd, std::chrono::milliseconds t) {
  timeval tv{static_cast<time_t>(t.count() / 1000), static_cast<suseconds_t>((t.count() % 1000) * 1000)};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string url_decode(std::string_view s) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && hex_value(s[i + 1]) >= 0 && hex_value(s[i + 2]) >= 0) {
      out += char(hex_value(s[i + 1]) * 16 + hex_value(s[i + 2]));
      i += 2;
    } else {
      out += s[i] == '+' ? ' ' : s[i];
    }
  }
  return out;
}

// The request's bearer token ("" when it carries none).
template <class Header>
std::string bearer_of(const Header& req) {
  auto auth = req[bhttp::field::authorization];
  return auth.starts_with("Bearer ") ? std::string(auth.substr(7)) : std::string();
}

template <class Header>
HttpRequest to_request(const Header& req, const std::string& peer) {
  HttpRequest r;
  r.method = std::string(req.method_string());
  std::string_view target(req.target().data(), req.target().size());
  auto q = target.find('?');
  r.path = url_decode(target.substr(0, q));
  if (q != std::string_view::npos) {
    std::string_view rest = target.substr(q + 1);
    while (!rest.empty()) {
      auto amp = rest.find('&');
      std::string_view item = rest.substr(0, amp);
      auto eq = item.find('=');
      r.query[url_decode(item.substr(0, eq))] = eq == std::string_view::npos ? "" : url_decode(item.substr(eq + 1));
      rest = amp == std::string_view::npos ? std::string_view{} : rest.substr(amp + 1);
    }
  }
  r.bearer = bearer_of(req);
  r.peer = peer;
  return r;
}

// The body of a streamed route, read into the handler's buffer as it asks.
class ParserBodyReader final : public BodyReader {
 public:
  ParserBodyReader(tcp::socket& sock, beast::flat_buffer& buf, bhttp::request_parser<bhttp::buffer_body>& parser)
      : sock_(sock), buf_(buf), parser_(parser) {}
  std::size_t read(char* dst, std::size_t n) override {
    while (!parser_.is_done() && n > 0) {
      parser_.get().body().data = dst;
      parser_.get().body().size = n;
      beast::error_code ec;
      bhttp::read(sock_, buf_, parser_, ec);
      if (ec == bhttp::error::need_buffer) ec = {};
      if (ec) throw std::runtime_error("reading the request body: " + ec.message());
      const std::size_t got = n - parser_.get().body().size;
      if (got > 0) return got;
    }
    return 0;
  }
  std::optional<std::uint64_t> content_length() const override {
    auto len = parser_.content_length();
    return len ? std::optional<std::uint64_t>(*len) : std::nullopt;
  }
  bool done() const { return parser_.is_done(); }

 private:
  tcp::socket& sock_;
  beast::flat_buffer& buf_;
  bhttp::request_parser<bhttp::buffer_body>& parser_;
};

class SocketChunkWriter final : public ChunkWriter {
 public:
  SocketChunkWriter(tcp::socket& sock, const std::atomic<bool>& stopping) : sock_(sock), stopping_(stopping) {}
  bool write(std::string_view data) override {
    if (failed_ || stopping_) return false;
    if (data.empty()) return true;   // an empty chunk would end the body
    beast::error_code ec;
    net::write(sock_, bhttp::make_chunk(net::const_buffer(data.data(), data.size())), ec);
    failed_ = bool(ec);
    return !failed_;
  }
  // Also true once the client has closed its end (a follower that went away while nothing was
  // written), so that its producer does not wait on for nobody.
  bool stopping() const override {
    if (stopping_ || failed_) return true;
    char c = 0;
    return ::recv(sock_.native_handle(), &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
  }
  bool failed() const { return failed_; }

 private:
  tcp::socket& sock_;
  const std::atomic<bool>& stopping_;
  bool failed_ = false;
};

// Sends `out` on `sock`: a string body, a file, or a chunked body; false when the connection
// cannot carry another request afterwards.
bool send_response(tcp::socket& sock, HttpResponse& out, unsigned version, bool keep_alive,
                   const std::atomic<bool>& stopping) {
  beast::error_code ec;
  const auto status = static_cast<bhttp::status>(out.status);
  if (out.chunks) {
    bhttp::response<bhttp::empty_body> res{status, version};
    res.set(bhttp::field::content_type, out.content_type);
    res.keep_alive(false);
    res.chunked(true);
    bhttp::response_serializer<bhttp::empty_body> sr{res};
    bhttp::write_header(sock, sr, ec);
    if (ec) return false;
    SocketChunkWriter writer(sock, stopping);
    out.chunks(writer);
    if (!writer.failed()) net::write(sock, bhttp::make_chunk_last(), ec);
    return false;
  }
  if (!out.file.empty()) {
    bhttp::response<bhttp::file_body> res{status, version};
    res.body().open(out.file.c_str(), beast::file_mode::scan, ec);
    if (ec) {   // gone between the handler's look and now
      HttpResponse missing{404, R"({"error":"the file is no longer there"})"};
      return send_response(sock, missing, version, keep_alive, stopping);
    }
    res.set(bhttp::field::content_type, out.content_type);
    res.keep_alive(keep_alive);
    res.prepare_payload();
    bhttp::write(sock, res, ec);
    return !ec && keep_alive;
  }
  bhttp::response<bhttp::string_body> res{status, version};
  res.set(bhttp::field::content_type, out.content_type);
  res.keep_alive(keep_alive);
  res.body() = std::move(out.body);
  res.prepare_payload();
  bhttp::write(sock, res, ec);
  return !ec && res.keep_alive();
}

}  // namespace

struct HttpServer::Impl {
  net::io_context ioc;
  tcp::acceptor acceptor{ioc};
  HttpHandler handler;
  std::vector<std::string> streamed;
  std::string token;   // "": the handler checks what it needs
  std::chrono::milliseconds header_deadline{0};
  std::atomic<bool> stopping{false};
  std::thread accept_thread;
  struct Connection {
    std::shared_ptr<tcp::socket> socket;
    std::thread thread;
    std::atomic<bool> done{false};
    // While it waits for a request's header: when that must be in (steady clock, ns); 0 otherwise.
    std::atomic<std::int64_t> header_due{0};
  };
  std::mutex mu;
  std::list<Connection> connections;   // joined when done (by the accept loop) or at stop
  // The watchdog: closes the connections whose header is overdue (each read is bounded by
  // kIdleTimeout, a trickle of bytes is not).
  std::condition_variable watchdog_cv;
  std::thread watchdog;

  void accept_loop();
  void watchdog_loop();
  void reap_finished();
  void serve(std::shared_ptr<tcp::socket> sock, std::atomic<std::int64_t>& header_due);
};

HttpServer::HttpServer(const std::string& bind, std::uint16_t port, HttpHandler handler, std::vector<std::string> streamed,
                       std::string token, std::chrono::milliseconds header_deadline)
    : impl_(std::make_unique<Impl>()) {
  impl_->handler = std::move(handler);
  impl_->streamed = std::move(streamed);
  impl_->token = std::move(token);
  impl_->header_deadline = header_deadline;
  beast::error_code ec;
  tcp::endpoint ep{net::ip::make_address(bind, ec), port};
  if (ec) throw std::runtime_error("bad bind address '" + bind + "': " + ec.message());
  impl_->acceptor.open(ep.protocol(), ec);
  if (!ec) impl_->acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) impl_->acceptor.bind(ep, ec);
  if (!ec) impl_->acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec) throw std::runtime_error("cannot listen on " + bind + ":" + std::to_string(port) + ": " + ec.message());
  port_ = impl_->acceptor.local_endpoint().port();
  impl_->accept_thread = std::thread([this] { impl_->accept_loop(); });
  impl_->watchdog = std::thread([this] { impl_->watchdog_loop(); });
}

HttpServer::~HttpServer() { stop(); }

void HttpServer::Impl::accept_loop() {
  while (!stopping) {
    auto sock = std::make_shared<tcp::socket>(ioc);
    beast::error_code ec;
    acceptor.accept(*sock, ec);
    if (stopping) break;
    if (ec) continue;
    reap_finished();
    std::lock_guard lk(mu);
    if (connections.size() >= kMaxConnections) {   // refuse rather than grow without bound
      sock->close(ec);
      continue;
    }
    Connection& c = connections.emplace_back();
    c.socket = sock;
    c.thread = std::thread([this, sock, &c] {
      serve(sock, c.header_due);
      c.done = true;
    });
    watchdog_cv.notify_one();   // it sleeps while no connection is open
  }
}

void HttpServer::Impl::watchdog_loop() {
  const auto period = std::clamp<std::chrono::milliseconds>(header_deadline / 4, std::chrono::milliseconds(50), std::chrono::seconds(1));
  std::unique_lock lk(mu);
  while (!stopping) {
    // Looks every `period` while a connection is open; with none, sleeps until one is accepted.
    const bool open = std::any_of(connections.begin(), connections.end(), [](const Connection& c) { return !c.done; });
    if (open) watchdog_cv.wait_for(lk, period); else watchdog_cv.wait(lk);
    const std::int64_t now = std::chrono::steady_clock::now().time_since_epoch().count();
    for (auto& c : connections) {
      const std::int64_t due = c.header_due.load();
      if (due != 0 && now > due && !c.done) {
        c.header_due = 0;
        ::shutdown(c.socket->native_handle(), SHUT_RDWR);   // its blocked read fails; serve() ends
      }
    }
  }
}

void HttpServer::Impl::reap_finished() {
  std::list<Connection> finished;
  {
    std::lock_guard lk(mu);
    for (auto it = connections.begin(); it != connections.end();) {
      auto next = std::next(it);
      if (it->done) finished.splice(finished.end(), connections, it);
      it = next;
    }
  }
  for (auto& c : finished) c.thread.join();
}

void HttpServer::Impl::serve(std::shared_ptr<tcp::socket> sock, std::atomic<std::int64_t>& header_due) {
  beast::error_code ec;
  auto remote = sock->remote_endpoint(ec);
  std::string peer = ec ? "?" : remote.address().to_string() + ":" + std::to_string(remote.port());
  set_socket_timeouts(sock->native_handle(), std::chrono::duration_cast<std::chrono::milliseconds>(kIdleTimeout));
  beast::flat_buffer buf;
  while (!stopping) {
    bhttp::request_parser<bhttp::empty_body> head;
    head.body_limit(kNoLimit);   // bounded below, by what reads the body
    header_due = (std::chrono::steady_clock::now() + header_deadline).time_since_epoch().count();
    bhttp::read_header(*sock, buf, head, ec);
    header_due = 0;
    if (ec) {
      if (ec != bhttp::error::end_of_stream && ec != net::error::eof && !stopping) {
        spdlog::debug("http: dropped connection from {}: {}", peer, ec.message());
      }
      break;
    }
    const std::string target(head.get().target());
    const std::string method(head.get().method_string());
    const unsigned version = head.get().version();
    const bool keep_alive = head.get().keep_alive();
    const std::string path = url_decode(std::string_view(target).substr(0, target.find('?')));
    const bool streamed_body = std::any_of(streamed.begin(), streamed.end(), [&](const std::string& p) {
      return path.rfind(p, 0) == 0;
    });
    HttpResponse out;
    bool reusable = keep_alive;
    bool unread_body = false;   // refused before its body was read
    auto run = [&](HttpRequest req) {
      try {
        out = handler(req);
      } catch (const std::exception& e) {
        out = HttpResponse{500, std::string(R"({"error":"internal error"})")};
        spdlog::error("http: handler failed for {} {}: {}", method, target, e.what());
      }
    };
    if (!token.empty() && !token_matches(bearer_of(head.get()), token)) {
      spdlog::warn("http: refused {} {} from {}: missing or wrong cluster token", method, path, peer);
      out = HttpResponse{401, R"({"error":"missing or wrong cluster token"})"};
      reusable = false;
      unread_body = true;
    } else if (streamed_body) {
      bhttp::request_parser<bhttp::buffer_body> parser{std::move(head)};
      parser.body_limit(kNoLimit);   // the handler bounds what it keeps
      ParserBodyReader reader(*sock, buf, parser);
      HttpRequest req = to_request(parser.get(), peer);
      req.body_reader = &reader;
      run(std::move(req));
      reusable = reusable && reader.done();   // a body the handler left unread ends the connection
    } else {
      bhttp::request_parser<bhttp::string_body> parser{std::move(head)};
      parser.body_limit(kBodyLimit);
      if (auto len = parser.content_length(); len && *len > kBodyLimit) {
        HttpResponse big{413, R"({"error":"the request body is over 64 MiB"})"};
        send_response(*sock, big, version, false, stopping);
        break;
      }
      bhttp::read(*sock, buf, parser, ec);
      if (ec) {
        spdlog::debug("http: dropped connection from {}: {}", peer, ec.message());
        break;
      }
      HttpRequest req = to_request(parser.get(), peer);
      req.body = std::move(parser.get().body());
      run(std::move(req));
    }
    if (!send_response(*sock, out, version, reusable, stopping)) {
      // A body left unread (a refused upload, a request without the token): stop writing, then
      // read and drop what the client still sends for a while (for one without the token, reads
      // begin for 2 s at most, each waiting up to 2 s), so that it reads the answer, not a reset.
      if ((streamed_body || unread_body) && !reusable) {
        sock->shutdown(tcp::socket::shutdown_send, ec);
        set_socket_timeouts(sock->native_handle(), std::chrono::milliseconds(2000));
        char sink[1 << 16];
        std::size_t dropped = 0;
        const auto until = unread_body ? std::chrono::steady_clock::now() + std::chrono::seconds(2) : std::chrono::steady_clock::time_point::max();
        while (dropped < (std::size_t(256) << 20) && !stopping && std::chrono::steady_clock::now() < until) {
          const std::size_t n = sock->read_some(net::buffer(sink), ec);
          if (ec || n == 0) break;
          dropped += n;
        }
      }
      break;
    }
  }
  sock->shutdown(tcp::socket::shutdown_both, ec);
  std::lock_guard lk(mu);   // the watchdog and stop() shut sockets down under mu: never one closed (its fd reused) meanwhile
  sock->close(ec);
}

void HttpServer::stop() {
  if (!impl_ || impl_->stopping.exchange(true)) return;
  beast::error_code ec;
  {   // wake the blocking accept() with a connection of our own
    net::io_context ioc;
    tcp::socket s{ioc};
    auto ep = impl_->acceptor.local_endpoint(ec);
    if (!ec) {
      if (ep.address().is_unspecified()) ep.address(net::ip::make_address("127.0.0.1"));
      s.connect(ep, ec);
    }
  }
  if (impl_->accept_thread.joinable()) impl_->accept_thread.join();
  {
    std::lock_guard lk(impl_->mu);   // stopping is set: the watchdog ends at its next look
  }
  impl_->watchdog_cv.notify_all();
  if (impl_->watchdog.joinable()) impl_->watchdog.join();
  impl_->acceptor.close(ec);
  std::list<Impl::Connection> all;
  {
    std::lock_guard lk(impl_->mu);
    for (auto& c : impl_->connections) ::shutdown(c.socket->native_handle(), SHUT_RDWR);   // wakes blocked reads
    all.splice(all.end(), impl_->connections);
  }
  for (auto& c : all) c.thread.join();
}

namespace {

ErrorException unreachable(const std::string& what, const std::string& host, std::uint16_t port, const beast::error_code& ec) {
  return ErrorException(Error{NetCode::Unreachable, what + " " + host + ":" + std::to_string(port) + ": " + ec.message()});
}

// A connected socket with `timeout` on each read and write (0: none).
void connect_to(tcp::socket& sock, net::io_context& ioc, const std::string& host, std::uint16_t port,
                std::chrono::milliseconds timeout) {
  beast::error_code ec;
  auto addr = net::ip::make_address(host, ec);
  if (ec) {
    tcp::resolver resolver{ioc};
    auto results = resolver.resolve(host, std::to_string(port), ec);
    if (ec || results.empty()) throw ErrorException(Error{NetCode::Unreachable, "cannot resolve " + host});
    addr = results.begin()->endpoint().address();
  }
  sock.connect(tcp::endpoint{addr, port}, ec);
  if (ec) throw unreachable("cannot reach", host, port, ec);
  if (timeout.count() > 0) set_socket_timeouts(sock.native_handle(), timeout);
}

template <class Body>
void prepare(bhttp::request<Body>& req, const std::string& host, const std::string& token) {
  req.set(bhttp::field::host, host);
  req.set(bhttp::field::content_type, "application/json");
  if (!token.empty()) req.set(bhttp::field::authorization, "Bearer " + token);
  req.keep_alive(false);
}

// The rest of an answer whose header `head` has read, as a string (an error's body).
HttpResponse read_rest(tcp::socket& sock, beast::flat_buffer& buf, bhttp::response_parser<bhttp::empty_body>&& head,
                       const std::string& host, std::uint16_t port) {
  bhttp::response_parser<bhttp::string_body> parser{std::move(head)};
  parser.body_limit(kBodyLimit);
  beast::error_code ec;
  bhttp::read(sock, buf, parser, ec);
  if (ec) throw unreachable("reading from", host, port, ec);
  auto& res = parser.get();
  return HttpResponse{static_cast<int>(res.result_int()), res.body(), std::string(res[bhttp::field::content_type])};
}

// Sends `req` and reads the answer's header into `head`. A server may answer (a refusal) before a
// body is all sent: the answer counts then, and a failed send is the error only without one.
template <class Body>
void send_read_header(tcp::socket& sock, bhttp::request<Body>& req, beast::flat_buffer& buf,
                      bhttp::response_parser<bhttp::empty_body>& head, const std::string& host, std::uint16_t port) {
  beast::error_code ec, sent;
  bhttp::write(sock, req, sent);
  head.body_limit(kNoLimit);   // bounded by what reads the body
  bhttp::read_header(sock, buf, head, ec);
  if (ec) throw unreachable(sent ? "sending to" : "reading from", host, port, sent ? sent : ec);
}

template <class Body>
HttpResponse exchange(tcp::socket& sock, bhttp::request<Body>& req, const std::string& host, std::uint16_t port) {
  beast::flat_buffer buf;
  bhttp::response_parser<bhttp::empty_body> head;
  send_read_header(sock, req, buf, head, host, port);
  return read_rest(sock, buf, std::move(head), host, port);
}

}  // namespace

HttpResponse http_call(const std::string& host, std::uint16_t port, const std::string& method,
                       const std::string& target, const std::string& body, const std::string& token,
                       std::chrono::milliseconds timeout) {
  net::io_context ioc;
  tcp::socket sock{ioc};
  connect_to(sock, ioc, host, port, timeout);
  bhttp::request<bhttp::string_body> req{bhttp::string_to_verb(method), target, 11};
  prepare(req, host, token);
  req.body() = body;
  req.prepare_payload();
  auto res = exchange(sock, req, host, port);
  beast::error_code ec;
  sock.shutdown(tcp::socket::shutdown_both, ec);
  return res;
}

HttpResponse http_upload(const std::string& host, std::uint16_t port, const std::string& method,
                         const std::string& target, const std::string& path, const std::string& token,
                         std::chrono::milliseconds timeout) {
  bhttp::request<bhttp::file_body> req{bhttp::string_to_verb(method), target, 11};
  beast::error_code ec;
  req.body().open(path.c_str(), beast::file_mode::scan, ec);
  if (ec) throw std::runtime_error("cannot read " + path + ": " + ec.message());
  net::io_context ioc;
  tcp::socket sock{ioc};
  connect_to(sock, ioc, host, port, timeout);
  prepare(req, host, token);
  req.set(bhttp::field::content_type, "application/octet-stream");
  req.prepare_payload();
  auto res = exchange(sock, req, host, port);
  sock.shutdown(tcp::socket::shutdown_both, ec);
  return res;
}

HttpResponse http_download(const std::string& host, std::uint16_t port, const std::string& target,
                           const std::string& path, const std::string& token, std::uint64_t max_bytes,
                           std::chrono::milliseconds timeout) {
  net::io_context ioc;
  tcp::socket sock{ioc};
  connect_to(sock, ioc, host, port, timeout);
  bhttp::request<bhttp::empty_body> req{bhttp::verb::get, target, 11};
  prepare(req, host, token);
  beast::flat_buffer buf;
  bhttp::response_parser<bhttp::empty_body> head;
  send_read_header(sock, req, buf, head, host, port);
  beast::error_code ec;
  if (head.get().result_int() != 200) return read_rest(sock, buf, std::move(head), host, port);
  bhttp::response_parser<bhttp::file_body> parser{std::move(head)};
  parser.body_limit(max_bytes);
  parser.get().body().open(path.c_str(), beast::file_mode::write, ec);
  if (ec) throw std::runtime_error("cannot write " + path + ": " + ec.message());
  bhttp::read(sock, buf, parser, ec);
  parser.get().body().close();
  if (ec) {
    std::remove(path.c_str());
    throw unreachable("downloading from", host, port, ec);
  }
  return HttpResponse{200, {}, std::string(parser.get()[bhttp::field::content_type])};
}

HttpResponse http_stream(const std::string& host, std::uint16_t port, const std::string& method,
                         const std::string& target, const std::string& token,
                         const std::function<bool(std::string_view)>& on_data, std::chrono::milliseconds idle) {
  net::io_context ioc;
  tcp::socket sock{ioc};
  connect_to(sock, ioc, host, port, idle);
  bhttp::request<bhttp::empty_body> req{bhttp::string_to_verb(method), target, 11};
  prepare(req, host, token);
  beast::flat_buffer buf;
  bhttp::response_parser<bhttp::empty_body> head;
  send_read_header(sock, req, buf, head, host, port);
  beast::error_code ec;
  if (head.get().result_int() != 200) return read_rest(sock, buf, std::move(head), host, port);
  bhttp::response_parser<bhttp::buffer_body> parser{std::move(head)};
  parser.body_limit(kNoLimit);
  char piece[64 * 1024];
  while (!parser.is_done()) {
    parser.get().body().data = piece;
    parser.get().body().size = sizeof piece;
    bhttp::read(sock, buf, parser, ec);
    if (ec == bhttp::error::need_buffer) ec = {};
    if (ec) throw unreachable("reading from", host, port, ec);
    const std::size_t got = sizeof piece - parser.get().body().size;
    if (got > 0 && !on_data(std::string_view(piece, got))) break;
  }
  sock.shutdown(tcp::socket::shutdown_both, ec);
  return HttpResponse{200, {}, std::string(parser.get()[bhttp::field::content_type])};
}

}  // namespace troupe::net
