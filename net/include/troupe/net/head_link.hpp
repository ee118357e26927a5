// The control messages between the head and the troupe processes of its cluster (node daemons,
// workers, drivers), on one link each (link.hpp): authenticated, heartbeated, pushed both ways.
// A message is a kind byte and a JSON object:
//   'H' hello      process -> head, first: who it is ({"role": "node"|"worker"|"driver", ...}); a
//                  driver's link may say hello again as a worker (a worker process's one link)
//   'W' welcome    head -> process, the answer to hello ({"error": why} when refused; then closed)
//   'O' order      head -> process: a command (start_worker, kill_worker; spawn, kill, exit)
//   'E' events     process -> head: {"events": [...]} (worker_exited; actor_ready, actor_failed)
//   'D' directory  head -> driver: {"version", "actors": [...]}, the actors that changed
//   'L' log        node -> head: a piece of a job's output, binary (encode_log): its driver's, or
//                  whole lines of one of its worker processes; at most kMaxLogPiece bytes, so a
//                  heartbeat never waits long behind one
// Bodies are bounded (kMaxControlMessage); anything malformed closes that link only.
//
// HeadSession is the process side: it opens the link, says hello, waits for the welcome, and
// then queues what the head sends for the owner's own thread to take (next), so that nothing
// the owner does (forking a worker, connecting to a peer) runs on the link's io thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "troupe/net/link.hpp"

namespace troupe::net {

namespace head_kind {
inline constexpr char kHello = 'H';
inline constexpr char kWelcome = 'W';
inline constexpr char kOrder = 'O';
inline constexpr char kEvents = 'E';
inline constexpr char kDirectory = 'D';
inline constexpr char kLog = 'L';
}  // namespace head_kind

inline constexpr std::size_t kMaxControlMessage = 16u << 20;

// How deep the JSON the head takes from outside (control messages, API bodies) may nest. Parsing
// is iterative, but printing and comparing a value recurse: a body of a million '[' would overflow
// the stack of whichever thread printed it (an error message naming a field of the wrong type).
inline constexpr int kMaxJsonDepth = 64;
// Whether `text`'s arrays and objects nest at most `max_depth` deep (strings are skipped, escapes
// included; the text need not be valid JSON: the parser judges that).
bool json_nesting_within(std::string_view text, int max_depth = kMaxJsonDepth);

// The JSON object a control message carries; std::runtime_error for a body over the bound, not
// JSON, nested deeper than kMaxJsonDepth, or not an object.
nlohmann::json decode_control(const std::vector<char>& body);
// Text that is not UTF-8 (a file name of a job's package, a path) goes as U+FFFD, never an
// exception. std::length_error for a message over kMaxControlMessage.
std::vector<char> encode_control(const nlohmann::json& body);

// A log piece: the job, the worker process it came from (0: the job's driver), the bytes.
inline constexpr std::size_t kMaxLogPiece = 64u << 10;
struct LogPiece {
  std::uint64_t job = 0;
  std::uint64_t worker = 0;
  std::string data;
};
std::vector<char> encode_log(const LogPiece& piece);
LogPiece decode_log(const std::vector<char>& body);   // std::runtime_error when malformed or over the bound

class HeadSession {
 public:
  struct Message {
    char kind = 0;            // kOrder, kDirectory, kWelcome (to a later hello); 0: the link ended ("why")
    nlohmann::json body;
  };

  // Connects through `hub` to the head's link address, sends `hello`, and waits for the welcome
  // until `timeout`. Throws ErrorException: NetCode::Unreachable (no head there, or no welcome in
  // time), NetCode::Refused (wrong token; or the head refused the hello: its reason).
  HeadSession(LinkHub& hub, const std::string& address, const nlohmann::json& hello, std::chrono::milliseconds timeout);
  ~HeadSession();   // close()
  HeadSession(const HeadSession&) = delete;
  HeadSession& operator=(const HeadSession&) = delete;

  const nlohmann::json& welcome() const { return welcome_; }
  // The next message from the head, waiting until `timeout`; nullopt if none came. Once the link
  // has ended, a kind-0 message (and then the same, at every call).
  std::optional<Message> next(std::chrono::milliseconds timeout);
  // A function that makes a waiting next() return (nullopt) at once, from any thread, as long as
  // this session's state lasts; afterwards it does nothing.
  std::function<void()> waker() const;
  // Sends a message to the head; false once the link has ended.
  bool send(char kind, const nlohmann::json& body);
  bool send_bytes(char kind, const std::vector<char>& body);   // a binary body (kLog)
  void close();
  bool ended() const;
  std::string address() const { return address_; }

 private:
  struct State;
  std::shared_ptr<State> state_;   // shared with the link's handlers, which may outlive this
  std::shared_ptr<Link> link_;
  nlohmann::json welcome_;
  std::string address_;
};

}  // namespace troupe::net
