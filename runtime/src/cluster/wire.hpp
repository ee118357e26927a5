// The control-plane messages of a cross-process actor call, as CAF serialises them over the
// middleman. Tensors travel as data-plane descriptors (inline when small, else UCX regions the
// receiver pulls). Every field of a received message is untrusted until checked.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/atom.hpp>
#include <caf/meta/type_name.hpp>

#include "troupe/codec.hpp"
#include "troupe/error.hpp"

namespace troupe::detail {

// Cluster actor ids (assigned by the head) start here; in-process ids stay below, so one table
// per process holds both.
inline constexpr std::uint64_t kClusterActorBase = std::uint64_t(1) << 48;

struct WireCall {
  std::string token;                          // SEC-1: checked by the gateway
  std::uint64_t actor_id = 0;
  std::uint64_t incarnation = 0;              // FT-2: a call for another incarnation is refused
  std::uint64_t seq = 0;
  std::string method;
  std::vector<char> args;                     // msgpack
  std::vector<std::vector<char>> tensors;     // encoded descriptors, by slot
  caf::actor reply_to;                        // the caller process's router
};

struct WireReply {
  std::uint64_t actor_id = 0;
  std::uint64_t incarnation = 0;
  std::uint64_t seq = 0;
  std::int32_t code = 0;                      // ErrorCode; 0 = Ok
  std::string error;
  std::vector<char> result;                   // msgpack
  std::vector<std::vector<char>> tensors;
  caf::actor gateway;                         // where to send the ack releasing result regions
};

// Tells the exposing process the receiver has the bytes of these regions (DP-1 (a)).
struct WireRelease {
  std::vector<std::uint64_t> regions;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, WireCall& x) {
  return f(caf::meta::type_name("troupe_call"), x.token, x.actor_id, x.incarnation, x.seq, x.method, x.args,
           x.tensors, x.reply_to);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, WireReply& x) {
  return f(caf::meta::type_name("troupe_reply"), x.actor_id, x.incarnation, x.seq, x.code, x.error, x.result,
           x.tensors, x.gateway);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, WireRelease& x) {
  return f(caf::meta::type_name("troupe_release"), x.regions);
}

// Asks a worker's gateway for the host of (token, actor id, incarnation); the answer is the
// host's handle, or an invalid one.
using host_atom = caf::atom_constant<caf::atom("tr_host")>;
// Asks a worker's gateway (token, then) for the "host:port" of its call channel server.
using calls_atom = caf::atom_constant<caf::atom("tr_calls")>;

// Registers the messages above with a system config (same names on every node).
void add_wire_types(caf::actor_system_config& cfg);

// Payload <-> wire form. to_wire exposes big tensors on the data plane and returns the regions
// to release once the peer has them. from_wire pulls every tensor (throws DecodeError for bad
// descriptors; a peer that died fails with CallError(ActorDied)).
struct WirePayload {
  std::vector<char> bytes;
  std::vector<std::vector<char>> tensors;
  std::vector<std::uint64_t> regions;   // exposed here; release after the peer has them
};
WirePayload to_wire(const Payload& p);
Payload from_wire(std::vector<char> bytes, const std::vector<std::vector<char>>& tensors,
                  std::chrono::milliseconds timeout, std::vector<std::uint64_t>* fetched_regions = nullptr);
void release_regions(const std::vector<std::uint64_t>& regions);

}  // namespace troupe::detail
