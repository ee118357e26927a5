#include "cluster/remote_route.hpp"

#include <caf/send.hpp>

#include "cluster/call_channel.hpp"

namespace troupe::cluster {

detail::Sent RemoteRoute::send(detail::Attempt&& a) {
  detail::WirePayload wp;
  try {
    wp = detail::to_wire(std::move(a.args));
  } catch (const std::exception& e) {
    return detail::Sent{nullptr, {}, Error{ErrorCode::Unavailable, std::string("could not send tensor arguments: ") + e.what()}};
  }
  detail::WireCall wc;
  wc.actor_id = actor_id_;
  wc.incarnation = incarnation_;
  wc.seq = a.seq;
  wc.method = a.method;
  wc.args = std::move(wp.bytes);
  wc.tensors = std::move(wp.tensors);
  return detail::Sent{carry(wc), std::move(wp.regions), std::nullopt};
}

const detail::Route* MiddlemanRoute::carry(detail::WireCall& call) {
  call.token = token_;
  call.reply_to = reply_to_;
  caf::anon_send(host_, std::move(call));
  return this;
}

const detail::Route* ChannelRoute::carry(detail::WireCall& call) {
  if (channel_->send(call)) return this;
  return fallback_->carry(call);
}

void deliver_reply(detail::ActorCell& cell, const detail::WireReply& r) {
  auto state = cell.take_reply(r.incarnation, r.seq);
  if (!state) return;
  if (!r.ok()) {
    state->fail(r.error_value());
    return;
  }
  std::vector<std::uint64_t> fetched;
  try {
    Payload p = detail::from_wire(r.result, r.tensors, std::chrono::seconds(60), &fetched);
    state->complete_from(p);
  } catch (const DecodeError& e) {
    state->fail(Error{ErrorCode::BadArguments, "reply did not decode: " + e.error().message});
  } catch (const ErrorException& e) {
    state->fail(e.error());
  } catch (const std::exception& e) {
    state->fail(Error{ErrorCode::BadArguments, std::string("reply did not decode: ") + e.what()});
  }
  if (!fetched.empty() && r.gateway) caf::anon_send(r.gateway, detail::WireRelease{fetched});
}

}  // namespace troupe::cluster
