// Routes to an actor in another process (route.hpp): through its host over CAF's middleman, or
// over the call channel to its process, which hands a call to the middleman route when the
// channel will not take it. Both encode the attempt once (to_wire: big tensors become data-plane
// regions the callee pulls) and answer by (incarnation, seq): deliver_reply.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <caf/actor.hpp>

#include "actor_cell.hpp"
#include "cluster/wire.hpp"
#include "route.hpp"

namespace troupe::cluster {

class CallChannel;

class RemoteRoute : public detail::Route {
 public:
  RemoteRoute(std::uint64_t actor_id, std::uint64_t incarnation, caf::actor gateway)
      : actor_id_(actor_id), incarnation_(incarnation), gateway_(std::move(gateway)) {}
  std::uint64_t incarnation() const override { return incarnation_; }
  bool local() const override { return false; }
  detail::Sent send(detail::Attempt&& attempt) final;
  // Carries an encoded call; returns the route that did (this one, or its fallback).
  virtual const detail::Route* carry(detail::WireCall& call) = 0;
  // The worker process's gateway (a middleman proxy), watched for its death.
  const caf::actor& gateway() const { return gateway_; }

 private:
  std::uint64_t actor_id_;
  std::uint64_t incarnation_;
  caf::actor gateway_;
};

// Through the middleman, straight to the actor's host, with the token on every call (SEC-1) and
// this process's router as the reply address.
class MiddlemanRoute final : public RemoteRoute {
 public:
  MiddlemanRoute(std::uint64_t actor_id, std::uint64_t incarnation, caf::actor gateway, caf::actor host,
                 std::string token, caf::actor reply_to)
      : RemoteRoute(actor_id, incarnation, std::move(gateway)), host_(std::move(host)), token_(std::move(token)),
        reply_to_(std::move(reply_to)) {}
  const detail::Route* carry(detail::WireCall& call) override;

 private:
  caf::actor host_;
  std::string token_;
  caf::actor reply_to_;
};

// Over the call channel to the actor's process (the token was presented once, at its handshake);
// a call the channel will not take (broken, too large for a frame) goes by the fallback.
class ChannelRoute final : public RemoteRoute {
 public:
  ChannelRoute(std::uint64_t actor_id, std::uint64_t incarnation, std::shared_ptr<CallChannel> channel,
               std::shared_ptr<MiddlemanRoute> fallback)
      : RemoteRoute(actor_id, incarnation, fallback->gateway()), channel_(std::move(channel)),
        fallback_(std::move(fallback)) {}
  const detail::Route* carry(detail::WireCall& call) override;
  std::shared_ptr<detail::Route> fallback() const override { return fallback_; }
  const CallChannel* channel() const { return channel_.get(); }

 private:
  std::shared_ptr<CallChannel> channel_;
  std::shared_ptr<MiddlemanRoute> fallback_;
};

// A reply from another process: completes the call it answers (FT-2 and the rest are the cell's
// business), pulling its result tensors and then telling the callee's gateway to release them.
void deliver_reply(detail::ActorCell& cell, const detail::WireReply& reply);

}  // namespace troupe::cluster
