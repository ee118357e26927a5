// WeightStore: the actor face of a WeightPublisher (manifest / release for pulls from other
// processes, follow for relays in a broadcast tree).
#include <cstring>

#include "transport/data_plane.hpp"
#include "troupe/weight_store.hpp"
#include "weights/set_builder.hpp"

namespace troupe {
namespace {

namespace tp = detail::transport;

PublisherOptions options_of(std::uint8_t compression, std::int64_t hold_lease_ms, std::int32_t device = -1) {
  if (compression > std::uint8_t(WireCompression::Int8Row)) throw std::invalid_argument("WeightStore: bad compression");
  PublisherOptions o;
  o.compression = static_cast<WireCompression>(compression);
  if (hold_lease_ms > 0) o.hold_lease = std::chrono::milliseconds(hold_lease_ms);
  o.device = device;
  return o;
}

// Deterministic f32 pattern in [-1, 1): element i of tensor t from `seed`.
void fill_pattern(float* p, std::int64_t n, std::uint64_t seed) {
  std::uint32_t x = std::uint32_t(seed * 2654435761u) | 1u;
  for (std::int64_t i = 0; i < n; ++i) {
    x ^= x << 13; x ^= x >> 17; x ^= x << 5;
    p[i] = float(std::int32_t(x)) * (1.0f / 2147483648.0f);
  }
}

}  // namespace

WeightStore::WeightStore() : publisher_(WeightPublisher::create()) {}

WeightStore::WeightStore(std::uint8_t compression, std::int64_t hold_lease_ms)
    : publisher_(WeightPublisher::create(options_of(compression, hold_lease_ms))) {}

WeightStore::WeightStore(std::uint8_t compression, std::int64_t hold_lease_ms, bool relay_maps)
    : publisher_(WeightPublisher::create(options_of(compression, hold_lease_ms))), relay_maps_(relay_maps) {}

WeightStore::WeightStore(std::uint8_t compression, std::int64_t hold_lease_ms, bool relay_maps, std::int32_t device)
    : publisher_(WeightPublisher::create(options_of(compression, hold_lease_ms, device))), relay_maps_(relay_maps) {}

WeightStore::~WeightStore() = default;

std::uint64_t WeightStore::publish(std::uint64_t version, std::vector<NamedTensor> tensors) {
  return publisher_->publish(version, tensors)->checksum();
}

std::uint64_t WeightStore::publish_synthetic(std::uint64_t version, std::vector<std::int64_t> numels,
                                             std::uint64_t seed) {
  std::vector<WeightEntry> entries;
  for (std::size_t i = 0; i < numels.size(); ++i) {
    entries.push_back({"w" + std::to_string(i), std::uint8_t(DType::F32), {numels[i]}});
  }
  return publisher_->publish_in_place(version, entries, [&](std::size_t i, void* dst) {
    fill_pattern(static_cast<float*>(dst), numels[i], seed + i);
  })->checksum();
}

std::uint64_t WeightStore::latest_version() {
  auto l = publisher_->latest();
  return l ? l->version() : 0;
}

WeightManifest WeightStore::manifest(std::uint64_t version, std::string subscriber, WeightOrigin caller,
                                     std::uint64_t have) {
  auto set = publisher_->get(version);
  if (!set) {
    throw WeightError(WeightError::Kind::NotFound,
                      "NotFound: version " + (version == kLatestVersion ? std::string("latest") : std::to_string(version)));
  }
  WeightManifest m;
  m.version = set->version();
  m.checksum = set->checksum();
  m.compression = std::uint8_t(set->compression());
  m.wire_bytes = set->wire_bytes();
  m.entries = detail::weights::SetBuilder::entries_of(*set);
  m.origin = WeightOrigin::self();
  m.publisher_key = publisher_->key();
  m.local = caller.nonce == m.origin.nonce && caller.pid == m.origin.pid;
  if (m.local || have == m.version) return m;   // nothing to pin: no transfer follows
  tp::ExposeOptions opts;
  opts.lease = publisher_->options().hold_lease;   // DP-1 (b) ends with the hold's lease
  auto d = tp::DataPlane::instance().expose(set->wire(), opts);
  // A subscriber on this host that maps the version, or imports its device mirror, keeps it while
  // it lives (WS-2), however long.
  const bool same_host = caller.host == m.origin.host;
  const auto* image = detail::weights::SetBuilder::device_image(*set);
  const bool device = same_host && image != nullptr && caller.device == image->handle.device;
  std::uint32_t holder = (caller.map || device) && same_host ? caller.pid : 0;
  if (auto replaced = publisher_->hold(set, subscriber, d.region, holder, &m.held_while_alive)) {
    tp::DataPlane::instance().release(replaced);
  }
  m.descriptor = tp::encode(d);
  if (device && m.held_while_alive) {
    m.device = image->handle.device;
    m.device_handle.assign(image->handle.bytes.begin(), image->handle.bytes.end());
    m.device_bytes = image->handle.nbytes;
    m.device_checksum = image->checksum;
  }
  return m;
}

void WeightStore::release(std::uint64_t version, std::string subscriber) {
  if (auto region = publisher_->release(version, subscriber)) tp::DataPlane::instance().release(region);
}

std::uint64_t WeightStore::follow(std::vector<ActorRef<WeightStore>> sources, std::uint64_t version) {
  std::vector<std::uint64_t> ids;
  for (const auto& s : sources) ids.push_back(s.id());
  if (!relay_ || ids != relay_sources_) {
    SubscriberOptions opts;
    opts.map_shared = relay_maps_;
    relay_ = std::make_unique<WeightSubscriber>(std::move(sources), opts);
    relay_sources_ = std::move(ids);
  }
  auto set = relay_->update(version);
  auto mine = publisher_->latest();
  if (!mine || mine->version() < set->version()) publisher_->adopt(set);
  return set->checksum();
}

void WeightStore::clear() {
  publisher_->clear();
  if (relay_) relay_->reset();   // its receive buffers stay pooled for the next follow()
}

PublisherStats WeightStore::stats() { return publisher_->stats(); }

std::vector<ActorRef<WeightStore>> tree_sources(const ActorRef<WeightStore>& publisher,
                                                const std::vector<ActorRef<WeightStore>>& relays, std::size_t k,
                                                std::size_t fanout) {
  // Heap order: node 0 is the publisher, receiver k is node k + 1, node i's parent is (i-1)/fanout.
  fanout = std::max<std::size_t>(fanout, 1);
  std::size_t parent = k / fanout;   // ((k + 1) - 1) / fanout
  std::vector<ActorRef<WeightStore>> out;
  if (parent > 0 && parent - 1 < relays.size()) out.push_back(relays[parent - 1]);
  out.push_back(publisher);
  return out;
}

}  // namespace troupe
