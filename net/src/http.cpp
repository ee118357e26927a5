#include "troupe/net/http.hpp"

#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <list>

namespace troupe::net {
namespace beast = boost::beast;
namespace bhttp = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

namespace {

constexpr std::size_t kBodyLimit = 64u << 20;
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

HttpRequest to_request(const bhttp::request<bhttp::string_body>& req, const std::string& peer) {
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
  auto auth = req[bhttp::field::authorization];
  if (auth.starts_with("Bearer ")) r.bearer = std::string(auth.substr(7));
  r.body = req.body();
  r.peer = peer;
  return r;
}

}  // namespace

struct HttpServer::Impl {
  net::io_context ioc;
  tcp::acceptor acceptor{ioc};
  HttpHandler handler;
  std::atomic<bool> stopping{false};
  std::thread accept_thread;
  struct Connection {
    std::shared_ptr<tcp::socket> socket;
    std::thread thread;
    std::atomic<bool> done{false};
  };
  std::mutex mu;
  std::list<Connection> connections;   // joined when done (by the accept loop) or at stop

  void accept_loop();
  void reap_finished();
  void serve(std::shared_ptr<tcp::socket> sock);
};

HttpServer::HttpServer(const std::string& bind, std::uint16_t port, HttpHandler handler)
    : impl_(std::make_unique<Impl>()) {
  impl_->handler = std::move(handler);
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
      serve(sock);
      c.done = true;
    });
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

void HttpServer::Impl::serve(std::shared_ptr<tcp::socket> sock) {
  beast::error_code ec;
  auto remote = sock->remote_endpoint(ec);
  std::string peer = ec ? "?" : remote.address().to_string() + ":" + std::to_string(remote.port());
  set_socket_timeouts(sock->native_handle(), std::chrono::duration_cast<std::chrono::milliseconds>(kIdleTimeout));
  beast::flat_buffer buf;
  while (!stopping) {
    bhttp::request_parser<bhttp::string_body> parser;
    parser.body_limit(kBodyLimit);
    bhttp::read(*sock, buf, parser, ec);
    if (ec) {
      if (ec != bhttp::error::end_of_stream && ec != net::error::eof && !stopping) {
        spdlog::debug("http: dropped connection from {}: {}", peer, ec.message());
      }
      break;
    }
    const auto& req = parser.get();
    HttpResponse out;
    try {
      out = handler(to_request(req, peer));
    } catch (const std::exception& e) {
      out = HttpResponse{500, std::string(R"({"error":"internal error"})")};
      spdlog::error("http: handler failed for {} {}: {}", std::string(req.method_string()),
                    std::string(req.target()), e.what());
    }
    bhttp::response<bhttp::string_body> res{static_cast<bhttp::status>(out.status), req.version()};
    res.set(bhttp::field::content_type, out.content_type);
    res.keep_alive(req.keep_alive());
    res.body() = std::move(out.body);
    res.prepare_payload();
    bhttp::write(*sock, res, ec);
    if (ec || !res.keep_alive()) break;
  }
  sock->shutdown(tcp::socket::shutdown_both, ec);
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
  impl_->acceptor.close(ec);
  std::list<Impl::Connection> all;
  {
    std::lock_guard lk(impl_->mu);
    for (auto& c : impl_->connections) ::shutdown(c.socket->native_handle(), SHUT_RDWR);   // wakes blocked reads
    all.splice(all.end(), impl_->connections);
  }
  for (auto& c : all) c.thread.join();
}

HttpResponse http_call(const std::string& host, std::uint16_t port, const std::string& method,
                       const std::string& target, const std::string& body, const std::string& token,
                       std::chrono::milliseconds timeout) {
  net::io_context ioc;
  tcp::socket sock{ioc};
  beast::error_code ec;
  auto addr = net::ip::make_address(host, ec);
  if (ec) {
    tcp::resolver resolver{ioc};
    auto results = resolver.resolve(host, std::to_string(port), ec);
    if (ec || results.empty()) throw ErrorException(Error{NetCode::Unreachable, "cannot resolve " + host});
    addr = results.begin()->endpoint().address();
  }
  sock.connect(tcp::endpoint{addr, port}, ec);
  if (ec) throw ErrorException(Error{NetCode::Unreachable, "cannot reach " + host + ":" + std::to_string(port) + ": " + ec.message()});
  set_socket_timeouts(sock.native_handle(), timeout);
  bhttp::request<bhttp::string_body> req{bhttp::string_to_verb(method), target, 11};
  req.set(bhttp::field::host, host);
  req.set(bhttp::field::content_type, "application/json");
  if (!token.empty()) req.set(bhttp::field::authorization, "Bearer " + token);
  req.keep_alive(false);
  req.body() = body;
  req.prepare_payload();
  bhttp::write(sock, req, ec);
  if (ec) throw ErrorException(Error{NetCode::Unreachable, "sending to " + host + ":" + std::to_string(port) + ": " + ec.message()});
  beast::flat_buffer buf;
  bhttp::response_parser<bhttp::string_body> parser;
  parser.body_limit(kBodyLimit);
  bhttp::read(sock, buf, parser, ec);
  if (ec) throw ErrorException(Error{NetCode::Unreachable, "reading from " + host + ":" + std::to_string(port) + ": " + ec.message()});
  sock.shutdown(tcp::socket::shutdown_both, ec);
  auto& res = parser.get();
  return HttpResponse{static_cast<int>(res.result_int()), res.body(), std::string(res[bhttp::field::content_type])};
}

}  // namespace troupe::net
