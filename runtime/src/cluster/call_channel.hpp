// The call channel: cross-process actor calls and their replies on one TCP connection per
// (caller process, worker process), beside CAF's middleman.
//
// Why: a call through the middleman crosses four threads per direction (caller, multiplexer,
// peer multiplexer, a scheduled actor) and costs ~115 us on a 2-core VM even for raw CAF; here
// the caller writes the frame itself, the worker's reader hands it to the host, the host writes
// the reply itself and the caller's reader completes the future. The middleman keeps
// everything else: spawn and kill, monitors (death of a worker), tensor release notices, and
// calls whenever no channel is up (the fallback keeps every call deliverable).
//
// The frames are net/frames.hpp's. Every received byte is untrusted: a bad frame closes that
// connection and nothing else.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <caf/actor.hpp>

#include "actor_host.hpp"
#include "cluster/wire.hpp"

namespace troupe::cluster {

// Worker side: accepts callers that present the token and hands their calls to the hosts it
// was told about. One reader thread per connection (a handful: one per caller process).
class CallServer {
 public:
  // Listens on `bind`, an ephemeral port. Throws std::runtime_error if it cannot.
  CallServer(std::string token, const std::string& bind);
  ~CallServer();   // stop()
  CallServer(const CallServer&) = delete;
  CallServer& operator=(const CallServer&) = delete;

  const std::string& address() const { return address_; }   // "host:port"
  // The worker's table of hosted actors (its gateway answers from it too).
  void add(std::uint64_t actor_id, std::uint64_t incarnation, caf::actor host);
  void remove(std::uint64_t actor_id);
  caf::actor find(std::uint64_t actor_id, std::uint64_t incarnation) const;   // invalid if not here
  // Closes the listener and every connection and joins their threads. Idempotent.
  void stop();

 private:
  struct Connection;
  void accept_loop();
  void serve(const std::shared_ptr<Connection>& conn);

  std::string token_;
  std::string address_;
  int listen_fd_ = -1;
  mutable std::mutex mu_;
  std::map<std::uint64_t, std::pair<caf::actor, std::uint64_t>> hosts_;   // id -> host, incarnation
  std::vector<std::pair<std::thread, std::shared_ptr<Connection>>> conns_;
  bool stopping_ = false;
  std::thread acceptor_;
};

// Caller side: one connection to one worker's CallServer.
class CallChannel {
 public:
  // Runs on the channel's reader thread for every reply.
  using ReplyHandler = std::function<void(detail::WireReply&)>;
  // Runs once on the reader thread when the connection ends (EOF, error, a bad frame, close()):
  // calls written on it will get no reply. Arguments: the channel, and whether this side had
  // closed it already.
  using BrokenHandler = std::function<void(const CallChannel* channel, bool closed_here)>;

  // Connects and presents the token; null (the reason logged) if the worker cannot be reached
  // within `timeout` or refuses. The reader thread holds the channel until the connection ends.
  static std::shared_ptr<CallChannel> open(const std::string& address, const std::string& token,
                                           ReplyHandler on_reply, BrokenHandler on_broken,
                                           std::chrono::milliseconds timeout);
  ~CallChannel();   // close()
  CallChannel(const CallChannel&) = delete;
  CallChannel& operator=(const CallChannel&) = delete;

  // Writes the call on the caller's own thread (a peer that stops reading blocks it at most
  // 10 s, then the connection is given up). False once the connection is broken or the call is too
  // large for a frame (the caller then sends it another way).
  bool send(const detail::WireCall& c);
  bool broken() const;
  // Shuts the connection and joins the reader. Idempotent; not from a reply handler.
  void close();

 private:
  CallChannel(int fd, ReplyHandler on_reply, BrokenHandler on_broken);
  void read_loop();

  int fd_;
  ReplyHandler on_reply_;
  BrokenHandler on_broken_;
  mutable std::mutex write_mu_;
  bool broken_ = false;   // guarded by write_mu_
  bool closed_ = false;   // close() was called (guarded by write_mu_)
  std::thread reader_;
};

}  // namespace troupe::cluster
