// An actor call between processes as the runtime handles it: the frames of net/frames.hpp (a call
// also carries the token its link proved, which the host checks again), and the conversion of a
// call's payload to its wire form. Tensors travel as data-plane descriptors (inline when small,
// else UCX regions the receiver pulls). Every field of a received message is untrusted until checked.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "troupe/codec.hpp"
#include "troupe/error.hpp"
#include "troupe/net/frames.hpp"

namespace troupe::net {
class Link;
}

namespace troupe::detail {

struct WireCall : net::CallFrame {
  std::string token;   // SEC-1: checked by the host
};

using WireReply = net::ReplyFrame;

// Payload <-> wire form. to_wire exposes big tensors on the data plane and returns the regions
// to release once the peer has them. from_wire pulls every tensor (throws DecodeError for bad
// descriptors; a peer that died fails with CallError(ActorDied)).
struct WirePayload {
  std::vector<char> bytes;
  std::vector<std::vector<char>> tensors;
  std::vector<std::uint64_t> regions;   // exposed here; release after the peer has them
};
// to_wire takes p.bytes (moved out) and leaves p.tensors, which it reads; tensors of up to
// `inline_max` bytes travel in the message (inline_limit(link): what suits the link; 0: the
// data plane's own limit, transport::kInlineMaxBytes).
WirePayload to_wire(Payload& p, std::size_t inline_max = 0);
Payload from_wire(std::vector<char> bytes, const std::vector<std::vector<char>>& tensors,
                  std::chrono::milliseconds timeout, std::vector<std::uint64_t>* fetched_regions = nullptr);
void release_regions(const std::vector<std::uint64_t>& regions);
// The inline_max for a message on `link`: larger by a same-host lane (transport::kLaneInlineMaxBytes).
std::size_t inline_limit(const net::Link& link);

}  // namespace troupe::detail
