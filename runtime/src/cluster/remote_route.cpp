#include "cluster/remote_route.hpp"

#include <algorithm>
#include <chrono>

#include "troupe/net/frames.hpp"

namespace troupe::cluster {

detail::Sent LinkRoute::send(detail::Attempt&& a) {
  if (link_->closed()) return detail::Sent{nullptr, {}, std::nullopt};   // unsent: args left as they were
  detail::WirePayload wp;
  try {
    wp = detail::to_wire(a.args, detail::inline_limit(*link_));
  } catch (const std::exception& e) {
    return detail::Sent{nullptr, {}, Error{ErrorCode::Unavailable, std::string("could not send tensor arguments: ") + e.what()}};
  }
  net::CallFrame c;
  c.actor_id = actor_id_;
  c.incarnation = incarnation_;
  c.seq = a.seq;
  c.method = a.method;
  c.args = std::move(wp.bytes);
  c.tensors = std::move(wp.tensors);
  std::vector<char> body;
  try {
    body = net::encode_call(c);
  } catch (const std::length_error&) {
    detail::release_regions(wp.regions);
    return detail::Sent{nullptr, {}, Error{ErrorCode::BadArguments, "the arguments are too large for one call (over 4 GiB encoded)"}};
  }
  // Batched: calls made in a row leave in one write; the caller's wait, or the io thread within
  // microseconds, writes it out.
  if (!link_->send('C', body, net::Link::Send::Batched, actor_id_)) {   // the link ended just now: unsent, the args given back
    detail::release_regions(wp.regions);
    a.args.bytes = std::move(c.args);
    return detail::Sent{nullptr, {}, std::nullopt};
  }
  return detail::Sent{this, std::move(wp.regions), std::nullopt};
}

void deliver_reply(detail::ActorCell& cell, const detail::WireReply& r, const ReleaseNotice& release) {
  auto state = cell.take_reply(r.incarnation, r.seq);
  if (!state) return;
  if (!r.ok()) {
    state->fail(r.error_value());
    return;
  }
  std::vector<std::uint64_t> fetched;
  // Its deadline was cancelled as the reply came: the tensors it pulls get what is left of it
  // (at most 60 s), so that a call of 1 s never waits a minute for its result's bytes.
  auto pull_for = std::chrono::milliseconds(60000);
  if (state->call_link.has_deadline) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(state->call_link.deadline.first -
                                                                            std::chrono::steady_clock::now());
    pull_for = std::clamp(left, std::chrono::milliseconds(1), pull_for);
  }
  try {
    Payload p = detail::from_wire(r.result, r.tensors, pull_for, &fetched);
    state->complete_from(p);
  } catch (const DecodeError& e) {
    state->fail(Error{ErrorCode::BadArguments, "reply did not decode: " + e.error().message});
  } catch (const ErrorException& e) {
    state->fail(e.error());
  } catch (const std::exception& e) {
    state->fail(Error{ErrorCode::BadArguments, std::string("reply did not decode: ") + e.what()});
  }
  if (!fetched.empty() && release) release(fetched);
}

}  // namespace troupe::cluster
