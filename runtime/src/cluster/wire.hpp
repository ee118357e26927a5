// The messages of a cross-process actor call as CAF serialises them over the middleman (a call
// channel sends the same frames, net/frames.hpp), and the conversion of a call's payload to its
// wire form. Tensors travel as data-plane descriptors (inline when small, else UCX regions the
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
#include "troupe/net/frames.hpp"

namespace troupe::detail {

// A call as it travels through the middleman: the frame, the token (SEC-1: checked by the host)
// and where the reply goes. On a call channel only the frame travels.
struct WireCall : net::CallFrame {
  std::string token;
  caf::actor reply_to;                        // the caller process's router
};

struct WireReply : net::ReplyFrame {
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
  return f(caf::meta::type_name("troupe_reply"), x.actor_id, x.incarnation, x.seq, x.error_domain, x.error_code,
           x.error, x.result, x.tensors, x.gateway);
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
WirePayload to_wire(Payload p);
Payload from_wire(std::vector<char> bytes, const std::vector<std::vector<char>>& tensors,
                  std::chrono::milliseconds timeout, std::vector<std::uint64_t>* fetched_regions = nullptr);
void release_regions(const std::vector<std::uint64_t>& regions);

}  // namespace troupe::detail
