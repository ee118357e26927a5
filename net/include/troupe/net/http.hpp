// A small HTTP/1.1 server and client for the operator and control planes (Boost.Beast inside;
// no Beast types here, so includers stay cheap to compile). JSON bodies; the cluster token
// travels as "Authorization: Bearer <token>". Large bodies stream: a route the server is told
// streams reads its request body itself (job packages: to disk, never whole in memory), and a
// response can be a file or a chunked body made while it is sent (followed job logs).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string_view>
#include <string>
#include <thread>
#include <vector>

#include "troupe/error.hpp"

namespace troupe::net {

// A request body its handler reads itself, piece by piece (streamed routes).
class BodyReader {
 public:
  virtual ~BodyReader() = default;
  // Up to `n` bytes into `buf`; 0 once the body has ended. Throws std::runtime_error when the
  // connection fails or the peer stops sending for the server's idle timeout.
  virtual std::size_t read(char* buf, std::size_t n) = 0;
  virtual std::optional<std::uint64_t> content_length() const = 0;
};

struct HttpRequest {
  std::string method;                        // "GET", "POST", ...
  std::string path;                          // "/api/v1/status" (no query)
  std::map<std::string, std::string> query;  // decoded ?a=b&c=d
  std::string bearer;                        // the token from the Authorization header, if any
  std::string body;                          // empty on a streamed route: read it from body_reader
  std::string peer;                          // "127.0.0.1:51234"
  BodyReader* body_reader = nullptr;         // streamed routes only; valid during the handler
};

// A chunked body's sink: write() sends one chunk; false once the client has gone or the server
// is stopping (the producer then returns).
class ChunkWriter {
 public:
  virtual ~ChunkWriter() = default;
  virtual bool write(std::string_view data) = 0;
  virtual bool stopping() const = 0;
};

struct HttpResponse {
  HttpResponse() = default;
  HttpResponse(int status_, std::string body_, std::string content_type_ = "application/json")
      : status(status_), body(std::move(body_)), content_type(std::move(content_type_)) {}

  int status = 200;
  std::string body;
  std::string content_type = "application/json";
  std::string file;                                  // set: the body is this file, streamed from disk
  std::function<void(ChunkWriter&)> chunks;          // set: a chunked body, made while it is sent
};

// A handler runs on the connection's own thread; it may block (long polls) but must return
// once the server is stopping (the owner makes that so). Exceptions become a 500 reply.
using HttpHandler = std::function<HttpResponse(const HttpRequest&)>;

class HttpServer {
 public:
  // Binds and starts accepting. port 0 picks a free port. Throws std::runtime_error if the
  // address cannot be bound. A request whose path starts with one of `streamed` is handed over
  // with its body unread (HttpRequest::body_reader); any other body is read whole, up to 64 MiB.
  // With a `token`, a request whose bearer token does not match it is answered 401 as soon as its
  // header is read, its body unread and its connection closed: a client without the token makes
  // the server hold no body (the handler still sees only requests that carried it). A request's
  // header must be in within `header_deadline` of the connection's readiness for it (its accept,
  // or the previous answer), however it trickles in; past it the connection is closed.
  HttpServer(const std::string& bind, std::uint16_t port, HttpHandler handler,
             std::vector<std::string> streamed = {}, std::string token = "",
             std::chrono::milliseconds header_deadline = std::chrono::seconds(120));
  ~HttpServer();   // stop()
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  std::uint16_t port() const { return port_; }
  // Stops accepting, closes every connection, joins every thread. Idempotent.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::uint16_t port_ = 0;
};

// One request on a fresh connection. Throws ErrorException(NetCode::Unreachable) when the peer
// cannot be reached or the exchange does not finish within `timeout`; any HTTP status is returned,
// not thrown.
HttpResponse http_call(const std::string& host, std::uint16_t port, const std::string& method,
                       const std::string& target, const std::string& body, const std::string& token,
                       std::chrono::milliseconds timeout);

// Sends the file at `path` as the request body (streamed from disk); the reply as http_call's.
// Throws ErrorException(NetCode::Unreachable) as http_call, or a std::runtime_error for a file it
// cannot read.
HttpResponse http_upload(const std::string& host, std::uint16_t port, const std::string& method,
                         const std::string& target, const std::string& path, const std::string& token,
                         std::chrono::milliseconds timeout);

// GETs `target` into the file at `path` (streamed to disk) when the answer is 200; any other
// answer is returned with its body and `path` is left alone. A 200 body over `max_bytes` throws
// ErrorException(NetCode::Unreachable) and removes the partial file.
HttpResponse http_download(const std::string& host, std::uint16_t port, const std::string& target,
                           const std::string& path, const std::string& token, std::uint64_t max_bytes,
                           std::chrono::milliseconds timeout);

// One request whose 200 body is handed to `on_data` piece by piece as it arrives (a chunked,
// followed body); `on_data` returns false to stop reading. Any other answer is returned with
// its body. `idle` bounds the wait for each piece (0: none).
HttpResponse http_stream(const std::string& host, std::uint16_t port, const std::string& method,
                         const std::string& target, const std::string& token,
                         const std::function<bool(std::string_view)>& on_data, std::chrono::milliseconds idle);

}  // namespace troupe::net
