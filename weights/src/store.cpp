// WeightStore: the actor face of a WeightPublisher (manifest / release for pulls from other
// processes, follow for relays in a broadcast tree, follow_async / progress for a pipelined chain).
#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <thread>

#include "troupe/transport/data_plane.hpp"
#include "troupe/weight_store.hpp"
#include "nccl_group.hpp"
#include "set_builder.hpp"

namespace troupe {
namespace {

namespace tp = troupe::transport;

// Deterministic f32 pattern in [-1, 1): element i of tensor t from `seed`.
void fill_pattern(float* p, std::int64_t n, std::uint64_t seed) {
  std::uint32_t x = std::uint32_t(seed * 2654435761u) | 1u;
  for (std::int64_t i = 0; i < n; ++i) {
    x ^= x << 13; x ^= x >> 17; x ^= x << 5;
    p[i] = float(std::int32_t(x)) * (1.0f / 2147483648.0f);
  }
}

constexpr std::uint64_t kAllBytes = std::numeric_limits<std::uint64_t>::max();

Error not_found_error(std::uint64_t version) {
  return Error{WeightCode::NotFound,
               "version " + (version == kLatestVersion ? std::string("latest") : std::to_string(version))};
}

[[noreturn]] void not_found(std::uint64_t version) { throw ErrorException(not_found_error(version)); }

// What every manifest of a published `set` says, whatever the path.
WeightManifest manifest_of(const WeightSet& set, std::uint64_t publisher_key) {
  WeightManifest m;
  m.version = set.version();
  m.checksum = set.checksum();
  m.compression = std::uint8_t(set.compression());
  m.wire_bytes = set.wire_bytes();
  m.entries = detail::weights::SetBuilder::entries_of(set);
  m.origin = WeightOrigin::self();
  m.publisher_key = publisher_key;
  return m;
}

using Clock = std::chrono::steady_clock;
constexpr std::int64_t kDayMs = 86'400'000;   // the longest time a caller may ask a group to wait
// A child asking for the version a relay is starting to pull waits this long for its manifest.
constexpr auto kArrivingManifestWait = std::chrono::seconds(10);

}  // namespace

// follow_async(): the pull on its own thread, and the version it is receiving, served to children
// as it lands. Shared by the actor thread (manifest, progress, release) and the pulling thread.
struct WeightStore::Stream {
  explicit Stream(std::shared_ptr<WeightPublisher> p) : publisher(std::move(p)) {}
  std::shared_ptr<WeightPublisher> publisher;   // the store's: what is complete here
  std::mutex mu;
  std::condition_variable changed;
  bool running = false;
  std::uint64_t wanted = 0;                  // the version asked for
  std::string error;                         // why the last pull failed ("" if it did not)
  Code error_code = WeightCode::Transfer;    // and its code
  std::uint64_t pulled_checksum = 0;         // the last pull's, when it succeeded
  std::optional<WeightManifest> arriving;    // the version being received, once its buffer exists
  TensorView wire;                           // its receive buffer
  std::atomic<std::uint64_t> landed{0};      // bytes in place from the start of `wire`
  std::uint64_t generation = 0;              // receive buffers ever started (a retry starts anew)
  std::uint64_t done_version = 0, done_generation = 0;   // the last version completed, and its buffer's
  struct Hold { std::uint64_t region; Clock::time_point expires; };
  std::map<std::pair<std::uint64_t, std::string>, Hold> holds;   // children pulling the arriving version
  std::uint64_t streamed = 0;                // such transfers ever started
  std::unique_ptr<WeightSubscriber> sub;     // the pulling side of follow and follow_async (buffers pooled)
  std::vector<std::uint64_t> sub_sources;
  std::thread worker;

  // landed(): callers waiting for bytes of a version, answered when they are here, when it
  // completes or fails, or when it starts over into another buffer (its generation changes).
  struct Waiter {
    std::uint64_t version, bytes, generation;
    Promise<FollowState> reply;
  };
  std::vector<Waiter> waiters;
  std::atomic<std::uint64_t> least_waited{std::numeric_limits<std::uint64_t>::max()};   // no waiter: max

  void sweep_locked(Clock::time_point now) {   // the data plane ends expired regions itself
    for (auto it = holds.begin(); it != holds.end();) it = it->second.expires < now ? holds.erase(it) : std::next(it);
  }

  // How much of `version` is here: what progress() answers.
  Result<FollowState> state_locked(std::uint64_t version) const {
    if (auto set = publisher->get(version)) {
      std::uint64_t gen = done_version == set->version() ? done_generation : 0;
      return FollowState{set->version(), set->wire_bytes(), set->wire_bytes(), true, gen};
    }
    if (arriving && (version == kLatestVersion || arriving->version == version)) {
      return FollowState{arriving->version, landed.load(std::memory_order_acquire), arriving->wire_bytes, false,
                         generation};
    }
    if (wanted == version) {
      if (running) return FollowState{version, 0, 0, false, 0};   // its manifest has not come yet
      if (!error.empty()) return Error{WeightCode::Transfer, error};
    }
    return not_found_error(version);
  }

  // Takes out the waiters that can be answered now, with their answers (sent after unlocking).
  using Answers = std::vector<std::pair<Promise<FollowState>, Result<FollowState>>>;
  Answers answerable_locked() {
    Answers out;
    std::uint64_t least = std::numeric_limits<std::uint64_t>::max();
    std::erase_if(waiters, [&](Waiter& w) {
      auto st = state_locked(w.version);
      if (!st.ok() || st.value().complete || st.value().landed >= w.bytes || st.value().generation != w.generation) {
        out.emplace_back(std::move(w.reply), std::move(st));
        return true;
      }
      least = std::min(least, w.bytes);
      return false;
    });
    least_waited.store(least, std::memory_order_release);
    return out;
  }
  static void send(Answers answers) {
    for (auto& [reply, st] : answers) {
      if (st.ok()) reply.set_value(st.value()); else reply.set_error(st.error());
    }
  }
  void answer_waiters() {
    Answers a;
    {
      std::lock_guard lock(mu);
      a = answerable_locked();
    }
    send(std::move(a));
  }
};

WeightStore::WeightStore() : WeightStore(PublisherOptions{}) {}

WeightStore::WeightStore(PublisherOptions opts)
    : publisher_(WeightPublisher::create(opts)), stream_(std::make_shared<Stream>(publisher_)) {}

WeightStore::~WeightStore() {
  if (stream_->worker.joinable()) stream_->worker.join();
}

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
  if (!set || version == kLatestVersion) {   // perhaps the version this relay is receiving
    auto& st = *stream_;
    std::unique_lock lock(st.mu);
    st.changed.wait_for(lock, kArrivingManifestWait, [&] { return !st.running || st.arriving.has_value(); });
    set = publisher_->get(version);   // it may have completed meanwhile
    if (st.running && st.arriving &&
        (version == kLatestVersion ? !set || st.arriving->version > set->version() : st.arriving->version == version)) {
      return streaming_manifest(*st.arriving, st.wire, subscriber, have);
    }
    // A relay whose own pull of this version failed, or has not started to land: a transfer
    // problem (the child tries its next source), not a version that does not exist.
    if (!set && st.wanted == version && (st.running || !st.error.empty())) {
      throw ErrorException(Error{WeightCode::Transfer,
                                 st.running ? "this relay is still waiting for the version" : st.error});
    }
  }
  if (!set) not_found(version);
  WeightManifest m = manifest_of(*set, publisher_->key());
  m.local = caller.nonce == m.origin.nonce && caller.pid == m.origin.pid;
  if (m.local || have == m.version) return m;   // nothing to pin: no transfer follows
  tp::ExposeOptions opts;
  opts.lease = publisher_->options().hold_lease;   // DP-1 (b) ends with the hold's lease
  auto d = tp::DataPlane::instance().expose(set->wire(), opts);
  // A subscriber on this host that maps the version, or imports its device mirror, keeps it while
  // it lives (WS-2), however long.
  const bool same_host = caller.host == m.origin.host;
  const auto* image = detail::weights::SetBuilder::device_image(*set);
  const bool device = same_host && image != nullptr && !caller.device_uuid.empty() &&
                      std::equal(caller.device_uuid.begin(), caller.device_uuid.end(), image->uuid.begin(),
                                 image->uuid.end());
  std::uint32_t holder = (caller.map || device) && same_host ? caller.pid : 0;
  if (auto replaced = publisher_->hold(set, subscriber, d.region, holder, &m.held_while_alive)) {
    tp::DataPlane::instance().release(replaced);
  }
  m.descriptor = tp::encode(d);
  if (device && m.held_while_alive) {
    m.device_handle.assign(image->handle.bytes.begin(), image->handle.bytes.end());
    m.device_checksum = image->checksum;
  }
  return m;
}

// Called with stream_->mu held.
WeightManifest WeightStore::streaming_manifest(const WeightManifest& arriving, const TensorView& wire,
                                               const std::string& subscriber, std::uint64_t have) {
  WeightManifest m;
  m.version = arriving.version;
  m.checksum = arriving.checksum;
  m.compression = arriving.compression;
  m.wire_bytes = arriving.wire_bytes;
  m.entries = arriving.entries;
  m.origin = WeightOrigin::self();
  m.publisher_key = publisher_->key();
  m.streaming = true;   // never local: the set does not exist yet, even in this process
  m.generation = stream_->generation;
  if (have == m.version) return m;
  tp::ExposeOptions opts;
  opts.lease = publisher_->options().hold_lease;
  auto d = tp::DataPlane::instance().expose(wire, opts);
  auto now = Clock::now();
  stream_->sweep_locked(now);
  ++stream_->streamed;
  auto& h = stream_->holds[{m.version, subscriber}];
  if (h.region != 0) tp::DataPlane::instance().release(h.region);
  h = {d.region, now + opts.lease};
  m.descriptor = tp::encode(d);
  return m;
}

void WeightStore::release(std::uint64_t version, std::string subscriber) {
  if (auto region = publisher_->release(version, subscriber)) tp::DataPlane::instance().release(region);
  std::lock_guard lock(stream_->mu);
  auto it = stream_->holds.find({version, subscriber});
  if (it == stream_->holds.end()) return;
  tp::DataPlane::instance().release(it->second.region);
  stream_->holds.erase(it);
}

void WeightStore::follow_async(std::vector<ActorRef<WeightStore>> sources, std::uint64_t version) {
  if (version == kLatestVersion) throw std::invalid_argument("follow_async: name the version");
  start_pull(std::move(sources), version, false);
}

std::uint64_t WeightStore::follow(std::vector<ActorRef<WeightStore>> sources, std::uint64_t version) {
  start_pull(std::move(sources), version, true);
  std::lock_guard lock(stream_->mu);
  if (!stream_->error.empty()) throw ErrorException(Error{stream_->error_code, stream_->error});
  return stream_->pulled_checksum;
}

void WeightStore::start_pull(std::vector<ActorRef<WeightStore>> sources, std::uint64_t version, bool here) {
  auto st = stream_;
  if (st->worker.joinable()) st->worker.join();
  std::vector<std::uint64_t> ids;
  for (const auto& s : sources) ids.push_back(s.id());
  if (!st->sub || ids != st->sub_sources) {
    SubscriberOptions opts;
    opts.map_shared = publisher_->options().relay_maps;
    Stream* raw = st.get();   // the stream owns the subscriber and its options: no shared_ptr cycle
    opts.on_receive_buffer = [raw](const WeightManifest& m, const TensorView& wire) {
      Stream::Answers answers;
      {
        std::lock_guard lock(raw->mu);
        raw->landed = 0;
        raw->arriving = m;
        raw->wire = wire;
        ++raw->generation;   // a retry from another source: children of the old buffer must not go on
        raw->changed.notify_all();
        answers = raw->answerable_locked();
      }
      Stream::send(std::move(answers));
    };
    opts.on_progress = [raw](std::size_t done, std::size_t) {
      raw->landed.store(done, std::memory_order_release);
      if (done >= raw->least_waited.load(std::memory_order_acquire)) raw->answer_waiters();
    };
    st->sub = std::make_unique<WeightSubscriber>(std::move(sources), opts);
    st->sub_sources = std::move(ids);
  }
  {
    std::lock_guard lock(st->mu);
    st->running = true;
    st->wanted = version;
    st->error.clear();
    st->arriving.reset();
    st->wire = {};
  }
  auto finish = [st](const std::string& error, Code code, std::uint64_t checksum) {
    Stream::Answers answers;
    std::unique_lock lock(st->mu);
    st->running = false;
    st->error = error;
    st->error_code = code;
    st->pulled_checksum = checksum;
    if (error.empty() && st->arriving) {
      st->done_version = st->arriving->version;
      st->done_generation = st->generation;
    }
    st->arriving.reset();
    st->wire = {};   // children's exposed regions keep the buffer while they pull
    st->changed.notify_all();
    answers = st->answerable_locked();
    lock.unlock();
    Stream::send(std::move(answers));
  };
  auto pull = [this, st, version, finish] {
    try {
      auto set = st->sub->update(version);
      auto mine = publisher_->latest();
      if (!mine || mine->version() < set->version()) publisher_->adopt(set);
      finish("", WeightCode::Transfer, set->checksum());
    } catch (const ErrorException& e) {
      Code code = e.code().domain() == ErrorDomain::Weights ? e.code() : Code(WeightCode::Transfer);
      finish(e.error().message, code, 0);
    } catch (const std::exception& e) {
      finish(e.what(), WeightCode::Transfer, 0);
    } catch (...) {
      finish("unknown exception", WeightCode::Transfer, 0);
    }
  };
  if (here) return pull();   // follow(): no thread to start and join for a pull it waits for anyway
  try {
    st->worker = std::thread(pull);
  } catch (const std::exception& e) {
    finish(e.what(), WeightCode::Transfer, 0);
    throw;
  }
}

FollowState WeightStore::progress(std::uint64_t version) {
  std::lock_guard lock(stream_->mu);   // taken first: the pull may complete between two looks
  auto st = stream_->state_locked(version);
  if (!st.ok()) throw ErrorException(st.error());
  return st.value();
}

Future<FollowState> WeightStore::landed(std::uint64_t version, std::uint64_t bytes) {
  std::lock_guard lock(stream_->mu);
  auto st = stream_->state_locked(version);
  if (!st.ok()) return make_error_future<FollowState>(st.error());
  if (st.value().complete || st.value().landed >= bytes) return make_ready_future(st.value());
  Promise<FollowState> reply;
  stream_->waiters.push_back({version, bytes, st.value().generation, reply});
  stream_->least_waited.store(std::min(stream_->least_waited.load(std::memory_order_relaxed), bytes),
                              std::memory_order_release);
  return reply.future();
}

void WeightStore::clear() {
  publisher_->clear();
  if (stream_->sub) stream_->sub->reset();   // its receive buffers stay pooled for the next pull
}

PublisherStats WeightStore::stats() {
  auto s = publisher_->stats();
  s.group_broadcasts = group_broadcasts_->load();
  std::lock_guard lock(stream_->mu);
  s.transfers += stream_->streamed;
  s.streamed = stream_->streamed;
  return s;
}

GroupSeat WeightStore::group_join(std::string group, std::int32_t size, std::string member, std::int64_t timeout_ms,
                                  std::int64_t retry_ms) {
  if (size < 2) throw std::invalid_argument("group_join: a group needs at least 2 ranks");
  if (timeout_ms <= 0 || timeout_ms > kDayMs) throw std::invalid_argument("group_join: the timeout must be in (0, 1 day]");
  if (retry_ms < 0 || retry_ms > kDayMs) throw std::invalid_argument("group_join: the retry time must be in [0, 1 day]");
  const int device = publisher_->options().device;
  if (device < 0) throw std::invalid_argument("group_join: this WeightStore mirrors its versions on no GPU");
  if (!groups_) groups_ = std::make_unique<detail::weights::GroupTable>(device, group_broadcasts_);
  return groups_->join(group, size, member, std::chrono::milliseconds(timeout_ms), std::chrono::milliseconds(retry_ms));
}

void WeightStore::group_leave(std::string group, std::string member, std::int64_t retry_ms) {
  if (retry_ms < 0 || retry_ms > kDayMs) throw std::invalid_argument("group_leave: the retry time must be in [0, 1 day]");
  if (groups_) groups_->leave(group, member, std::chrono::milliseconds(retry_ms));
}

WeightManifest WeightStore::group_pull(std::string group, std::uint64_t epoch, std::uint64_t version,
                                       std::string member) {
  auto* root = groups_ ? groups_->find(group, epoch) : nullptr;
  if (root == nullptr) {
    throw ErrorException(Error{WeightCode::Rejoin, "NCCL group " + group + " epoch " + std::to_string(epoch) +
                                                       " is gone: join again"});
  }
  auto set = root->ask(member, version, [this](std::uint64_t v) {
    auto s = publisher_->get(v);
    if (!s) not_found(v);
    return s;
  });
  WeightManifest m = manifest_of(*set, publisher_->key());
  m.device_checksum = detail::weights::SetBuilder::device_image(*set)->checksum;
  return m;
}

void chain_broadcast(const ActorRef<WeightStore>& publisher, const std::vector<ActorRef<WeightStore>>& relays,
                     std::uint64_t version, std::chrono::milliseconds timeout) {
  if (version == kLatestVersion) throw std::invalid_argument("chain_broadcast: name the version");
  for (std::size_t k = 0; k < relays.size(); ++k) {
    std::vector<ActorRef<WeightStore>> sources;
    if (k > 0) sources.push_back(relays[k - 1]);
    sources.push_back(publisher);
    relays[k].call(&WeightStore::follow_async, sources, version).get();
  }
  const auto deadline = Clock::now() + timeout;
  const Error late{WeightCode::Transfer, "chain broadcast of version " + std::to_string(version) +
                                            " did not complete in time"};
  for (const auto& r : relays) {   // the chain completes in order; each relay answers when it has
    for (;;) {                     // it all (or when its pull starts over: then ask again)
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) throw ErrorException(late);
      auto st = r.with_timeout(left).call(&WeightStore::landed, version, kAllBytes).result();
      if (!st.ok() && st.error().code == ErrorCode::Timeout) throw ErrorException(late);
      if (!st.ok()) throw CallError(st.error());
      if (st.value().complete) break;
    }
  }
}

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
