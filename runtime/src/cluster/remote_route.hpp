// The route to an actor in another process (route.hpp): a link to that process (net/link.hpp),
// on which each attempt is one 'C' message (to_wire: big tensors become data-plane regions the
// callee pulls) and the callee answers by (incarnation, seq): deliver_reply. A link that will not
// take a message leaves the attempt unsent: the table sends it at the next bind.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "actor_cell.hpp"
#include "cluster/wire.hpp"
#include "route.hpp"
#include "troupe/net/link.hpp"

namespace troupe::cluster {

class LinkRoute final : public detail::Route {
 public:
  LinkRoute(std::uint64_t actor_id, std::uint64_t incarnation, std::shared_ptr<net::Link> link)
      : actor_id_(actor_id), incarnation_(incarnation), link_(std::move(link)) {}
  std::uint64_t incarnation() const override { return incarnation_; }
  bool local() const override { return false; }
  detail::Sent send(detail::Attempt&& attempt) override;
  const net::Link* link() const { return link_.get(); }

 private:
  std::uint64_t actor_id_;
  std::uint64_t incarnation_;
  std::shared_ptr<net::Link> link_;
};

// Tells the callee that its result tensors have been pulled (it may free them).
using ReleaseNotice = std::function<void(const std::vector<std::uint64_t>& regions)>;

// A reply from another process: completes the call it answers (FT-2 and the rest are the cell's
// business), pulling its result tensors first and then sending the release notice.
void deliver_reply(detail::ActorCell& cell, const detail::WireReply& reply, const ReleaseNotice& release);

}  // namespace troupe::cluster
