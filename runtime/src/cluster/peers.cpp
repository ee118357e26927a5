#include "cluster/peers.hpp"

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include <msgpack.hpp>

#include "actor_host.hpp"
#include "cluster/remote_route.hpp"
#include "cluster/wire.hpp"
#include "runtime_impl.hpp"
#include "troupe/net/frames.hpp"
#include "troupe/transport/descriptor.hpp"

namespace troupe::cluster {
namespace {

constexpr char kCall = 'C', kReply = 'R', kRelease = 'L';
constexpr auto kConnectTimeout = std::chrono::seconds(5);

// The reply of a call that came on `link` goes back on it.
class LinkSink final : public detail::ReplySink {
 public:
  explicit LinkSink(std::weak_ptr<net::Link> link) : link_(std::move(link)) {}
  void reply(const detail::WireReply& r, bool more) override {
    auto link = link_.lock();
    if (!link) return;   // the caller went away: nobody waits for this reply
    std::vector<char> body;
    try {
      body = net::encode_reply(r);
    } catch (const std::length_error&) {   // a result over 4 GiB of msgpack: an error instead
      net::ReplyFrame e;
      e.actor_id = r.actor_id;
      e.incarnation = r.incarnation;
      e.seq = r.seq;
      e.set_error(Error{ErrorCode::MethodFailed, "the result is too large for one reply (over 4 GiB of encoded bytes)"});
      body = net::encode_reply(e);
    }
    link->send(kReply, body, more ? net::Link::Send::Batched : net::Link::Send::Now);
  }
  std::size_t inline_max() const override {
    auto link = link_.lock();
    return link ? detail::inline_limit(*link) : 0;
  }

 private:
  std::weak_ptr<net::Link> link_;
};

std::vector<char> encode_regions(const std::vector<std::uint64_t>& regions) {
  msgpack::sbuffer buf;
  msgpack::pack(buf, regions);
  return std::vector<char>(buf.data(), buf.data() + buf.size());
}

std::vector<std::uint64_t> decode_regions(const std::vector<char>& body) {
  std::size_t off = 0;
  msgpack::unpack_limit limits(/*array*/ 1u << 20, 0, 0, 0, 0, /*depth*/ 2);
  auto h = msgpack::unpack(body.data(), body.size(), off, nullptr, nullptr, limits);
  if (off != body.size()) throw std::runtime_error("a release notice with trailing bytes");
  return h.get().as<std::vector<std::uint64_t>>();
}

// Whether the reply carries tensors to pull over the data plane (not inline).
bool pulls_tensors(const detail::WireReply& r) {
  for (const auto& raw : r.tensors) {
    try {
      if (!transport::decode_descriptor_view(raw.data(), raw.size()).descriptor.is_inline) return true;
    } catch (const ErrorException&) {
      return false;   // a bad descriptor fails the call when it is decoded, wherever that is
    }
  }
  return false;
}

}  // namespace

namespace {
// Same-host links get a shared-memory lane: on_message is thread-safe (the tables it reads are
// locked, a call is a mailbox send, a reply completes a future), as a lane requires.
net::LinkOptions link_options() {
  net::LinkOptions o;
  o.lane = true;
  return o;
}
}  // namespace

Peers::Peers(detail::RuntimeImpl& rt, std::string token, std::string role)
    : rt_(rt), hub_(std::make_unique<net::LinkHub>(token, net::self_identity(role), link_options())),
      token_(std::move(token)), role_(std::move(role)) {}

Peers::~Peers() { stop(); }

net::Link::MessageHandler Peers::message_handler() {
  return [this](net::Link& link, char kind, std::vector<char>& body) { on_message(link, kind, body); };
}

net::Link::ClosedHandler Peers::closed_handler() {
  return [this](net::Link& link, net::LinkEnd end, const std::string& why) { on_closed(link, end, why); };
}

std::string Peers::listen(const std::string& bind) {
  auto address = hub_->listen(bind, [this](const std::shared_ptr<net::Link>& link) {
    link->set_handlers(message_handler(), closed_handler());
    std::lock_guard lk(mu_);
    std::erase_if(inbound_, [](const std::shared_ptr<net::Link>& l) { return l->closed(); });
    inbound_.push_back(link);
  });
  std::lock_guard lk(mu_);
  address_ = address;
  return address;
}

std::string Peers::address() const {
  std::lock_guard lk(mu_);
  return address_;
}

void Peers::host(std::uint64_t actor_id, std::uint64_t incarnation, std::shared_ptr<detail::LocalRoute> host) {
  host->set_remote_id(actor_id);
  std::lock_guard lk(mu_);
  hosted_[actor_id] = {std::move(host), incarnation};
}

void Peers::unhost(std::uint64_t actor_id) {
  std::lock_guard lk(mu_);
  hosted_.erase(actor_id);
}

std::shared_ptr<detail::LocalRoute> Peers::find(std::uint64_t actor_id, std::uint64_t incarnation) const {
  std::lock_guard lk(mu_);
  auto it = hosted_.find(actor_id);
  return it != hosted_.end() && it->second.second == incarnation ? it->second.first : nullptr;
}

void Peers::on_loss(LossHandler handler) {
  std::lock_guard lk(loss_mu_);
  on_loss_ = std::move(handler);
}

std::shared_ptr<net::Link> Peers::link_to(const std::string& address) {
  {
    std::lock_guard lk(mu_);
    if (stopping_) return nullptr;
    if (auto it = outbound_.find(address); it != outbound_.end() && !it->second->closed()) return it->second;
  }
  std::shared_ptr<net::Link> link;
  try {
    link = hub_->connect(address, message_handler(), closed_handler(), kConnectTimeout);
  } catch (const ErrorException& e) {
    spdlog::warn("peers: cannot link to {}: {}", address, e.error().message);
    return nullptr;
  }
  std::shared_ptr<net::Link> spare;   // another thread linked meanwhile: keep that one
  {
    std::lock_guard lk(mu_);
    auto& slot = outbound_[address];
    if (slot && !slot->closed()) spare = std::exchange(link, slot);
    else slot = link;
  }
  if (spare) spare->close("a spare link to the same peer");
  return link;
}

void Peers::on_message(net::Link& link, char kind, std::vector<char>& body) {
  switch (kind) {
    case kCall: serve_call(link, body); return;
    case kReply: take_reply(link, body); return;
    case kRelease:
      detail::release_regions(decode_regions(body));
      return;
    default:
      throw std::runtime_error("unknown message kind " + std::to_string(int(kind)));
  }
}

void Peers::serve_call(net::Link& link, std::vector<char>& body) {
  detail::WireCall call;
  static_cast<net::CallFrame&>(call) = net::decode_call(body.data(), body.size());
  call.token = token_;   // the link's handshake proved it: the host checks it again (SEC-1)
  auto sink = std::make_shared<LinkSink>(link.shared_from_this());
  if (auto host = find(call.actor_id, call.incarnation)) {
    host->deliver(detail::ChannelCall{std::move(call), std::move(sink)});
    return;
  }
  detail::WireReply r;   // FT-2: not hosted here, or another incarnation
  r.actor_id = call.actor_id;
  r.incarnation = call.incarnation;
  r.seq = call.seq;
  r.set_error(Error{ErrorCode::ActorDied, "actor " + std::to_string(call.actor_id) + " incarnation " +
                                              std::to_string(call.incarnation) + " is not hosted here"});
  sink->reply(r, false);
}

void Peers::take_reply(net::Link& link, std::vector<char>& body) {
  detail::WireReply r;
  static_cast<net::ReplyFrame&>(r) = net::decode_reply(body.data(), body.size());
  auto cell = rt_.find(r.actor_id);
  if (!cell) return;   // released meanwhile: nobody waits for it
  std::weak_ptr<net::Link> back = link.shared_from_this();
  auto release = [back](const std::vector<std::uint64_t>& regions) {
    if (auto l = back.lock()) l->send(kRelease, encode_regions(regions));
  };
  if (!pulls_tensors(r)) {
    deliver_reply(*cell, r, release);
    return;
  }
  // Pulling may take seconds: not on the io thread, which every link of this process shares.
  std::lock_guard lk(mu_);
  if (stopping_) return;
  std::erase_if(fetchers_, [](Fetcher& f) {
    if (!f.done->load()) return false;
    f.thread.join();
    return true;
  });
  auto done = std::make_shared<std::atomic<bool>>(false);
  fetchers_.push_back(Fetcher{std::thread([cell, r = std::move(r), release, done] {
                                deliver_reply(*cell, r, release);
                                done->store(true);
                              }),
                              done});
}

void Peers::on_closed(net::Link& link, net::LinkEnd end, const std::string& why) {
  {
    std::lock_guard lk(mu_);
    if (auto it = outbound_.find(link.address()); it != outbound_.end() && it->second.get() == &link) outbound_.erase(it);
    std::erase_if(inbound_, [&](const std::shared_ptr<net::Link>& l) { return l.get() == &link; });
  }
  spdlog::info("peers: link to {} ({}, pid {}) ended: {}", link.address(), link.peer().role, link.peer().pid, why);
  std::lock_guard lk(loss_mu_);
  if (on_loss_) on_loss_(link, end, why);
}

void Peers::stop() {
  std::vector<Fetcher> fetchers;
  {
    std::lock_guard lk(mu_);
    if (stopping_) return;
    stopping_ = true;
    fetchers.swap(fetchers_);
    hosted_.clear();
  }
  on_loss(nullptr);
  hub_->stop();   // joins the io thread: no handler runs after this
  for (auto& f : fetchers) f.thread.join();
  std::lock_guard lk(mu_);
  outbound_.clear();
  inbound_.clear();
}

}  // namespace troupe::cluster
