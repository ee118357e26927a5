// The messages of an actor call between processes, as bodies of link messages (net/link.hpp):
//   'C' call    caller -> callee: [actor_id, incarnation, seq, method, args, [tensors]]
//   'R' reply   callee -> caller: [actor_id, incarnation, seq, error domain, error code, message,
//                                   result, [tensors]]
// msgpack arrays. Every received byte is untrusted: decode_* refuse anything malformed with
// std::runtime_error, and the link that carried it is closed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "troupe/error.hpp"

namespace troupe::net {

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

// encode_* throw std::length_error for a body over 4 GiB; decode_* throw std::runtime_error.
std::vector<char> encode_call(const CallFrame& c);
CallFrame decode_call(const char* data, std::size_t size);
std::vector<char> encode_reply(const ReplyFrame& r);
ReplyFrame decode_reply(const char* data, std::size_t size);

}  // namespace troupe::net
