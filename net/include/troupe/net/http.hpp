// A small HTTP/1.1 server and client for the operator and control planes (Boost.Beast inside;
// no Beast types here, so includers stay cheap to compile). JSON bodies; the cluster token
// travels as "Authorization: Bearer <token>".
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "troupe/error.hpp"

namespace troupe::net {

struct HttpRequest {
  std::string method;                        // "GET", "POST", ...
  std::string path;                          // "/api/v1/status" (no query)
  std::map<std::string, std::string> query;  // decoded ?a=b&c=d
  std::string bearer;                        // the token from the Authorization header, if any
  std::string body;
  std::string peer;                          // "127.0.0.1:51234"
};

struct HttpResponse {
  int status = 200;
  std::string body;
  std::string content_type = "application/json";
};

// A handler runs on the connection's own thread; it may block (long polls) but must return
// once the server is stopping (the owner makes that so). Exceptions become a 500 reply.
using HttpHandler = std::function<HttpResponse(const HttpRequest&)>;

class HttpServer {
 public:
  // Binds and starts accepting. port 0 picks a free port. Throws std::runtime_error if the
  // address cannot be bound.
  HttpServer(const std::string& bind, std::uint16_t port, HttpHandler handler);
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

}  // namespace troupe::net
