// The frames of a call connection between two troupe processes (the runtime's call channel):
// u32 little-endian body length, then the body: one kind byte and a msgpack value.
//   'H' token (raw bytes)   caller -> callee, first frame; SEC-1 is checked once per connection
//   'O' / 'E' message       callee -> caller, the handshake's answer ('E' then closes)
//   'C' call                caller -> callee: [actor_id, incarnation, seq, method, args, [tensors]]
//   'R' reply               callee -> caller: [actor_id, incarnation, seq, error domain, error code,
//                                              message, result, [tensors]]
// Every received byte is untrusted: decode_* refuse anything malformed, and read_frame any length
// over its bound, so that a bad frame closes its connection and nothing else.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "troupe/error.hpp"

namespace troupe::net {

inline constexpr char kHelloFrame = 'H', kOkFrame = 'O', kRefusedFrame = 'E', kCallFrame = 'C',
                      kReplyFrame = 'R';
inline constexpr std::uint32_t kMaxHandshakeFrame = 4096;   // before the token is checked
inline constexpr std::uint32_t kMaxFrame = 0xFFFFFFF0u;     // after: calls may carry big msgpack args

// One attempt of an actor call. Tensors travel as encoded data-plane descriptors, by slot.
struct CallFrame {
  std::uint64_t actor_id = 0;
  std::uint64_t incarnation = 0;              // FT-2: a call for another incarnation is refused
  std::uint64_t seq = 0;
  std::string method;
  std::vector<char> args;                     // msgpack
  std::vector<std::vector<char>> tensors;
};

// Its answer: a result, or the Error the call failed with (domain and code intact).
struct ReplyFrame {
  std::uint64_t actor_id = 0;
  std::uint64_t incarnation = 0;
  std::uint64_t seq = 0;
  std::uint8_t error_domain = 0;              // Code of the failure; (Core, Ok) = a result
  std::uint16_t error_code = 0;
  std::string error;                          // the failure's message
  std::vector<char> result;                   // msgpack
  std::vector<std::vector<char>> tensors;

  bool ok() const { return error_domain == 0 && error_code == 0; }
  void set_error(const Error& e);
  Error error_value() const;                  // valid when !ok(); an unknown code reads as Internal
};

// Whole frames (header included). encode_* throw std::length_error for a body the u32 length
// cannot describe (the caller then sends it another way); decode_* take the body after the kind
// byte and throw std::runtime_error on bad bytes.
std::vector<char> encode_call(const CallFrame& c);
CallFrame decode_call(const char* data, std::size_t size);
std::vector<char> encode_reply(const ReplyFrame& r);
ReplyFrame decode_reply(const char* data, std::size_t size);
std::vector<char> small_frame(char kind, const std::string& body);

// Blocking frame I/O on a connected socket.
bool write_all(int fd, const char* p, std::size_t n);   // false on error (the stream is then unusable)
// One frame's kind and body; false at EOF, on error, or when the length exceeds `max`.
bool read_frame(int fd, std::uint32_t max, char& kind, std::vector<char>& body);
void set_nodelay(int fd);
void set_recv_timeout(int fd, std::chrono::milliseconds t);   // 0: none
void set_send_timeout(int fd, std::chrono::milliseconds t);

}  // namespace troupe::net
