// WeightSubscriber: manifest -> (same host) a mapping of the publisher's version (never written), or a
// copy: from a mapping, chunks copied and hashed in cache on two threads; otherwise bucketed,
// pipelined UCX gets into a pooled shared-memory buffer, each bucket hashed while the next is in
// flight -> checksum compared (WS-1) -> swap.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <future>
#include <thread>

#include <spdlog/spdlog.h>

#include "troupe/transport/data_plane.hpp"
#include "troupe/weight_store.hpp"
#include "buffer_pool.hpp"
#include "set_builder.hpp"

namespace troupe {
namespace {

using Clock = std::chrono::steady_clock;
namespace tp = troupe::transport;

std::string new_subscriber_id() {
  static std::atomic<std::uint64_t> next{1};
  const auto& o = WeightOrigin::self();
  return o.host + ":" + std::to_string(o.pid) + ":" + std::to_string(o.nonce) + ":" + std::to_string(next++);
}

[[noreturn]] void fail(WeightCode code, const std::string& why) { throw ErrorException(Error{code, why}); }

// Pulls [0, wire.nbytes) of `d` bucket by bucket; bucket b+1's get overlaps bucket b's hash.
// Returns the checksum of what landed.
// `ready(end)`, when given, returns once the source has bytes [0, end) (a streaming relay).
std::uint64_t fetch_checked(const tp::TensorDescriptor& d, const TensorView& wire, std::size_t bucket,
                            Clock::time_point deadline, const SubscriberOptions& opts,
                            const std::function<void(std::size_t)>& ready = nullptr) {
  const std::size_t total = wire.nbytes();
  auto* base = static_cast<char*>(wire.data);
  auto fetch = [&](std::size_t off) {
    tp::TensorDescriptor part = d;
    std::size_t len = std::min(bucket, total - off);
    part.dtype = DType::U8;
    part.shape = {std::int64_t(len)};
    part.nbytes = len;
    if (!d.is_inline) part.remote_address = d.remote_address + off;
    else part.inline_bytes.assign(d.inline_bytes.begin() + off, d.inline_bytes.begin() + off + len);
    if (ready) ready(off + len);
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) throw ErrorException(Error{TransportCode::Timeout, "pull deadline passed"});
    tp::DataPlane::instance().fetch_into(part, TensorView::wrap(base + off, DType::U8, {std::int64_t(len)}, wire.keep_alive), left);
  };
  std::uint64_t sum = checksum_init(total);
  std::future<void> next = std::async(std::launch::async, fetch, std::size_t(0));
  for (std::size_t off = 0; off < total; off += bucket) {
    next.get();
    std::size_t len = std::min(bucket, total - off);
    if (off + len < total) next = std::async(std::launch::async, fetch, off + len);
    sum = checksum_update(sum, base + off, len, off);
    if (opts.on_progress) opts.on_progress(off + len, total);   // may throw: `next` is joined by its destructor
  }
  return sum;
}

// Copies `total` bytes from a mapping of the publisher's buffer into `dst`, hashing each 1 MiB
// chunk right after copying it (still in cache: one pass over memory, not two), on two threads
// (even and odd chunks). Progress (the bytes both threads have passed) is reported from this
// thread; if the callback throws, the other thread stops too.
std::uint64_t copy_checked(const char* src, char* dst, std::size_t total, const SubscriberOptions& opts) {
  const std::size_t chunks = (total + kChecksumChunk - 1) / kChecksumChunk;
  std::vector<std::uint64_t> hashes(chunks);
  std::atomic<bool> stop{false};
  std::atomic<std::size_t> other_next{1};   // the odd thread's next chunk: all before it are done
  auto work = [&](std::size_t first, bool report) {
    for (std::size_t i = first; i < chunks && !stop.load(std::memory_order_relaxed); i += 2) {
      std::size_t off = i * kChecksumChunk, len = std::min(kChecksumChunk, total - off);
      std::memcpy(dst + off, src + off, len);
      hashes[i] = checksum_chunk(dst + off, len, i);
      if (!report) {
        other_next.store(i + 2, std::memory_order_release);
      } else if (opts.on_progress) {
        std::size_t done = std::min(i + 1, other_next.load(std::memory_order_acquire));
        opts.on_progress(std::min(total, done * kChecksumChunk), total);
      }
    }
  };
  std::thread other(work, std::size_t(1), false);
  try {
    work(0, true);
  } catch (...) {
    stop = true;
    other.join();
    throw;
  }
  other.join();
  std::uint64_t sum = checksum_init(total);
  for (auto h : hashes) sum = checksum_fold(sum, h);
  if (opts.on_progress) opts.on_progress(total, total);
  return sum;
}

void check_entries(const WeightManifest& m) {
  for (const auto& e : m.entries) {
    if (!dtype_valid(e.dtype)) fail(WeightCode::Transfer, "manifest names a bad dtype");
  }
  if (m.compression > std::uint8_t(WireCompression::Int8Row)) fail(WeightCode::Transfer, "manifest names a bad compression");
  auto c = static_cast<WireCompression>(m.compression);
  if (detail::weights::SetBuilder::wire_bytes(m.entries, c) != m.wire_bytes) {
    fail(WeightCode::Transfer, "manifest sizes do not match its entries");
  }
}


// `ready(end)` of fetch_checked for a relay still receiving the version (a streaming manifest):
// returns once the relay has bytes [0, end). The relay answers when they have landed (landed(): a
// deferred reply, no polling).
std::function<void(std::size_t)> relay_landing(const ActorRef<WeightStore>& relay, const WeightManifest& m,
                                               Clock::time_point deadline) {
  return [relay, version = m.version, generation = m.generation, deadline](std::size_t end) {
    const Error late{TransportCode::Timeout, "the relay's version did not arrive in time"};
    for (;;) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) throw ErrorException(late);
      auto st = relay.with_timeout(left).call(&WeightStore::landed, version, std::uint64_t(end)).result();
      if (!st.ok() && st.error().code == ErrorCode::Timeout) throw ErrorException(late);
      if (!st.ok()) fail(WeightCode::Transfer, "relay: " + st.error().to_string());
      if (st.value().generation != generation) {   // it started over into another buffer
        fail(WeightCode::Transfer, "relay: the version is arriving anew there");
      }
      if (st.value().complete || st.value().landed >= end) return;
    }
  };
}

// A view of `data` that keeps `pin` (its mapping) and ends `store`'s hold on version `v` for
// `pull_id` when the last copy of it is dropped: held while used (WS-2).
std::shared_ptr<void> held_while_used(void* data, std::shared_ptr<void> pin, const ActorRef<WeightStore>& store,
                                      std::uint64_t v, const std::string& pull_id) {
  return std::shared_ptr<void>(data, [pin = std::move(pin), src = store, v, id = pull_id](void*) mutable {
    pin.reset();
    src.tell(&WeightStore::release, v, id);   // if the runtime is gone, the store sees this process end
  });
}

// A version that arrived in device memory (CUDA IPC, NCCL), `total` bytes at `data` kept alive by
// `keep`, as a set. With verify_mapped, WS-1 first: the bytes hashed (one device-to-host pass)
// against the publisher's checksum of the decoded image.
WeightSetPtr device_set(const WeightManifest& m, void* data, std::size_t total, std::shared_ptr<void> keep,
                        const SubscriberOptions& opts) {
  if (opts.verify_mapped) {
    std::vector<char> bytes(total);
    std::string error;
    if (!detail::weights::gpu::copy_to_host(data, total, bytes.data(), opts.device, &error)) {
      fail(WeightCode::Transfer, "device check: " + error);
    }
    if (weight_checksum(bytes.data(), total) != m.device_checksum) {
      fail(WeightCode::Checksum, "version " + std::to_string(m.version) + " on device " +
                                            std::to_string(opts.device) + " does not match its checksum");
    }
  }
  if (opts.on_progress) opts.on_progress(m.wire_bytes, m.wire_bytes);
  return detail::weights::SetBuilder::on_device(m.version, m.checksum, m.entries,
                                                static_cast<WireCompression>(m.compression), data, opts.device,
                                                std::move(keep));
}

}  // namespace

struct WeightSubscriber::GroupMember {
  std::unique_ptr<detail::weights::gpu::NcclBroadcaster> comm;   // null: not joined (or broken)
  std::uint64_t epoch = 0;
  Clock::time_point retry_after{};
};

WeightSubscriber::WeightSubscriber(std::vector<ActorRef<WeightStore>> sources, SubscriberOptions opts)
    : sources_(std::move(sources)), opts_(std::move(opts)), id_(new_subscriber_id()),
      pool_(std::make_shared<detail::weights::BufferPool>(opts_.idle_buffers)) {
  opts_.bucket_bytes = std::max(kChecksumChunk, (opts_.bucket_bytes + kChecksumChunk - 1) / kChecksumChunk * kChecksumChunk);
  if (sources_.empty()) throw std::invalid_argument("WeightSubscriber needs a source");
  if (!opts_.nccl_group.empty()) {   // the options alone, before any device is looked at
    if (opts_.device < 0) throw std::invalid_argument("WeightSubscriber: nccl_group needs a device");
    if (opts_.nccl_group_size < 2) throw std::invalid_argument("WeightSubscriber: nccl_group_size must be at least 2");
    if (opts_.nccl_timeout <= std::chrono::milliseconds(0) || opts_.nccl_timeout > std::chrono::hours(24)) {
      throw std::invalid_argument("WeightSubscriber: nccl_timeout must be in (0, 1 day]");
    }
  }
  detail::weights::SetBuilder::check_device(opts_.device, "WeightSubscriber");
  if (opts_.device >= 0) {
    std::string error;
    auto uuid = detail::weights::gpu::device_uuid(opts_.device, &error);
    if (!uuid) throw std::invalid_argument("WeightSubscriber: device " + std::to_string(opts_.device) + ": " + error);
    device_uuid_.assign(uuid->begin(), uuid->end());
  }
  if (!opts_.nccl_group.empty()) {
    std::string error;
    if (!detail::weights::gpu::NcclBroadcaster::available(&error)) throw std::invalid_argument("WeightSubscriber: " + error);
    group_ = std::make_unique<GroupMember>();
  }
}

WeightSubscriber::~WeightSubscriber() = default;

WeightSetPtr WeightSubscriber::current() const {
  std::lock_guard lock(mu_);
  return current_;
}

void WeightSubscriber::reset() {
  WeightSetPtr dropped;
  std::lock_guard lock(mu_);
  dropped = std::move(current_);
}

WeightSetPtr WeightSubscriber::update(std::uint64_t version) {
  auto set = pull(version);
  WeightSetPtr old;   // freed outside the lock; readers that loaded it keep it (WS-2)
  std::lock_guard lock(mu_);
  old = std::move(current_);
  current_ = set;
  return set;
}

WeightSetPtr WeightSubscriber::pull(std::uint64_t version) {
  if (group_) {
    if (auto set = pull_group(version)) return set;
  }
  // A parent relay may not have the version (yet), or may be going away: the next source (the
  // publisher last) is asked then too. NotFound only when no source has it.
  std::string errors;
  bool none_has_it = true;
  for (const auto& source : sources_) {
    try {
      return pull_from(source, version);
    } catch (const ErrorException& e) {
      if (e.code() == WeightCode::Checksum) throw;
      none_has_it = none_has_it && e.code() == WeightCode::NotFound;
      errors += std::string(errors.empty() ? "" : "; ") + e.what();
    }
  }
  if (none_has_it) fail(WeightCode::NotFound, "no source has it: " + errors);
  fail(WeightCode::Transfer, "every source failed: " + errors);
}

WeightSetPtr WeightSubscriber::pull_from(const ActorRef<WeightStore>& source, std::uint64_t version) {
  const auto deadline = Clock::now() + opts_.timeout;
  // Each pull holds under its own name: a mapping of an earlier pull of the same version, dropped
  // later, must not end this pull's hold (WS-2).
  static std::atomic<std::uint64_t> pulls{0};
  const std::string pull_id = id_ + "#" + std::to_string(++pulls);
  auto have = current();
  WeightOrigin me = WeightOrigin::self();
  me.map = opts_.map_shared;
  me.device_uuid = device_uuid_;
  if (!opts_.allow_local) me.nonce = 0;   // never taken for the store's own process
  // A store of this process (a colocated trainer's) is asked with no deadline: call_sync then runs
  // its manifest, a method that waits for nothing, on this thread when it is idle, with no
  // hand-over to the store's thread and no wake-up, which were most of a colocated pull's cost.
  // One in another process is asked under the deadline.
  const bool local = source.cell() != nullptr && !detail::cell_remote(*source.cell());
  const ActorRef<WeightStore> store = local ? source : source.with_timeout(opts_.timeout);
  auto reply = [&]() -> Result<WeightManifest> {
    try {
      return store.call_sync(&WeightStore::manifest, version, pull_id, me, have ? have->version() : 0);
    } catch (const ErrorException& e) {
      return e.error();
    }
  }();
  if (!reply.ok()) {
    const auto& err = reply.error();
    // The store's own NotFound (a nested call's failure would arrive as MethodFailed).
    fail(err.code == WeightCode::NotFound ? WeightCode::NotFound : WeightCode::Transfer, "manifest: " + err.to_string());
  }
  WeightManifest m = std::move(reply).value();
  if (have && m.version == have->version()) return have;
  if (m.local) {
    auto pub = WeightPublisher::find_local(m.publisher_key);
    auto set = pub ? pub->get(m.version) : nullptr;
    if (!set) fail(WeightCode::NotFound, "version " + std::to_string(m.version) + " is gone");
    return opts_.device >= 0 ? detail::weights::SetBuilder::to_device(set, opts_.device) : set;
  }
  struct Release {   // ends the publisher's hold whatever happens (not waited for)
    const ActorRef<WeightStore>& src; std::uint64_t v; const std::string& id; bool armed = true;
    ~Release() { if (armed) src.tell(&WeightStore::release, v, id); }
  } release{source, m.version, pull_id};
  check_entries(m);
  if (opts_.device >= 0 && m.held_while_alive && !m.device_handle.empty()) {
    if (auto set = import_device(m, source, pull_id, &release.armed)) return set;
  }
  std::uint64_t sum = 0;
  TensorView wire;
  try {
    auto d = tp::decode_descriptor(m.descriptor);
    if (d.nbytes != m.wire_bytes) fail(WeightCode::Transfer, "descriptor size does not match the manifest");
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    TensorView mapped = !m.streaming && m.origin.host == WeightOrigin::self().host && left.count() > 0
                            ? tp::DataPlane::instance().map(d, left) : TensorView{};
    // Kept mapped only under a hold for this process's lifetime (a lease could end under a live
    // mapping); under a lease the mapping only serves the copy below, done before `release`.
    if (mapped.data != nullptr && opts_.map_shared && m.held_while_alive) {
      if (opts_.verify_mapped) sum = weight_checksum(mapped.data, m.wire_bytes);
      else sum = m.checksum;   // written once and never again while held (see SubscriberOptions)
      if (opts_.on_progress) opts_.on_progress(m.wire_bytes, m.wire_bytes);
      // The hold ends when the last view of this version here is dropped.
      release.armed = false;
      wire = TensorView::wrap(mapped.data, DType::U8, {std::int64_t(m.wire_bytes)},
                              held_while_used(mapped.data, mapped.keep_alive, source, m.version, pull_id));
    } else if (mapped.data != nullptr) {
      wire = pool_->get(m.wire_bytes);
      if (opts_.on_receive_buffer) opts_.on_receive_buffer(m, wire);
      sum = copy_checked(static_cast<const char*>(mapped.data), static_cast<char*>(wire.data), m.wire_bytes, opts_);
    } else {
      wire = pool_->get(m.wire_bytes);
      if (opts_.on_receive_buffer) opts_.on_receive_buffer(m, wire);
      // From a relay still receiving the version: each bucket once it has landed there.
      sum = fetch_checked(d, wire, opts_.bucket_bytes, deadline, opts_,
                          m.streaming ? relay_landing(source, m, deadline) : nullptr);
    }
  } catch (const ErrorException& e) {
    if (e.code().domain() != ErrorDomain::Transport) throw;
    fail(WeightCode::Transfer, std::string("transfer: ") + e.what());
  }
  if (sum != m.checksum) {
    fail(WeightCode::Checksum, "version " + std::to_string(m.version) + " arrived with checksum " +
                                          std::to_string(sum) + ", published " + std::to_string(m.checksum));
  }
  auto set = detail::weights::SetBuilder::from_wire(m.version, m.checksum, m.entries,
                                                    static_cast<WireCompression>(m.compression), std::move(wire), *pool_);
  return opts_.device >= 0 ? detail::weights::SetBuilder::to_device(set, opts_.device) : set;
}

WeightSetPtr WeightSubscriber::import_device(const WeightManifest& m, const ActorRef<WeightStore>& source,
                                             const std::string& pull_id, bool* release_armed) {
  namespace gpu = detail::weights::gpu;
  std::size_t total = 0;
  (void)detail::weights::SetBuilder::offsets(m.entries, &total);
  gpu::IpcHandle h;
  if (m.device_handle.size() != h.bytes.size()) fail(WeightCode::Transfer, "manifest's device handle is malformed");
  std::copy(m.device_handle.begin(), m.device_handle.end(), h.bytes.begin());
  h.nbytes = total;
  h.device = opts_.device;   // the store matched the GPU by UUID; its index there may differ
  std::string error;
  std::shared_ptr<gpu::IpcMapping> mapping = gpu::IpcMapping::open(h, &error);
  if (!mapping) {   // e.g. the store's own process (CUDA IPC is between processes)
    spdlog::info("weights: CUDA IPC import of version {} failed ({}); pulling it through host memory", m.version, error);
    return nullptr;
  }
  void* data = mapping->data();
  std::shared_ptr<void> keep;
  if (opts_.map_shared) {   // in place: the hold ends when the last view here is dropped
    *release_armed = false;
    keep = held_while_used(data, mapping, source, m.version, pull_id);
  } else {                  // one device-to-device copy; the hold ends with this pull
    std::shared_ptr<gpu::DeviceBuffer> buf = gpu::DeviceBuffer::allocate(total, opts_.device, &error);
    if (!buf || !buf->copy_from(data, total, &error)) fail(WeightCode::Transfer, "device copy: " + error);
    mapping.reset();
    data = buf->data();
    keep = std::move(buf);
  }
  return device_set(m, data, total, std::move(keep), opts_);
}

WeightSetPtr WeightSubscriber::pull_group(std::uint64_t version) {
  namespace gpu = detail::weights::gpu;
  auto& g = *group_;
  const auto& store = sources_.back();
  const auto timeout = opts_.nccl_timeout;
  const auto retry_ms = std::int64_t(opts_.nccl_retry.count());
  // After a failure: this member leaves (the store then holds every member off for nccl_retry, so
  // that they gather again together) and the pull takes the other paths.
  auto give_up = [&](const std::string& why) -> WeightSetPtr {
    spdlog::warn("weights: NCCL group {}: {}; pulling by the other paths", opts_.nccl_group, why);
    if (g.comm) g.comm->abort();   // ranks still waiting on this one end at their own deadline
    g.comm.reset();
    g.retry_after = Clock::now() + opts_.nccl_retry;
    store.tell(&WeightStore::group_leave, opts_.nccl_group, id_, retry_ms);
    return nullptr;
  };
  // Asks for a seat until the group is formed (every member asking), then joins the communicator.
  enum class Joined { Yes, Later, No };
  auto join = [&](std::string* why) {
    const auto deadline = Clock::now() + timeout;
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) {
        *why = "the other members did not all come within " + std::to_string(timeout.count()) + " ms";
        return Joined::No;
      }
      auto seat = store.with_timeout(left)
                      .call(&WeightStore::group_join, opts_.nccl_group, std::int32_t(opts_.nccl_group_size), id_,
                            std::int64_t(timeout.count()), retry_ms)
                      .result();
      if (!seat.ok()) {
        *why = "joining: " + seat.error().to_string();
        return Joined::No;
      }
      const auto& s = seat.value();
      if (s.retry_in_ms > 0) {   // held off after a failure: come back with the others
        g.retry_after = Clock::now() + std::chrono::milliseconds(s.retry_in_ms);
        return Joined::Later;
      }
      if (s.ready) {
        std::array<char, 128> id{};
        if (s.id.size() != id.size() || s.rank < 1 || s.rank >= s.size) {
          *why = "the store's seat is malformed";
          return Joined::No;
        }
        std::copy(s.id.begin(), s.id.end(), id.begin());
        g.comm = gpu::NcclBroadcaster::create(id, s.rank, s.size, opts_.device, timeout, why);
        if (!g.comm) {
          *why = "joining as rank " + std::to_string(s.rank) + ": " + *why;
          return Joined::No;
        }
        g.epoch = s.epoch;
        return Joined::Yes;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  };
  WeightManifest m;
  for (;;) {
    const bool fresh = !g.comm;   // (a failed broadcast is given up at once: no comm is kept broken)
    if (fresh) {
      if (Clock::now() < g.retry_after) return nullptr;
      std::string why;
      switch (join(&why)) {
        case Joined::Yes: break;
        case Joined::Later: return nullptr;
        case Joined::No: return give_up(why);
      }
    }
    auto reply = store.with_timeout(timeout).call(&WeightStore::group_pull, opts_.nccl_group, g.epoch, version, id_).result();
    if (reply.ok()) {
      m = std::move(reply).value();
      break;
    }
    const Code code = reply.error().code;
    if (code == WeightCode::Rejoin && !fresh) {   // gathered anew (or broke): join it in this pull
      g.comm->abort();
      g.comm.reset();
      continue;
    }
    if (code == WeightCode::NotFound) {   // refused before it asked: the group is sound; the other paths say NotFound
      spdlog::info("weights: NCCL group {}: {}", opts_.nccl_group, reply.error().to_string());
      return nullptr;
    }
    return give_up("asking: " + reply.error().to_string());   // it may have asked (a lost reply): leave
  }
  // Asked: the group's broadcast now counts on this rank, so any failure from here aborts it.
  std::size_t total = 0;
  std::shared_ptr<gpu::DeviceBuffer> buf;
  std::string error;
  try {
    check_entries(m);
    (void)detail::weights::SetBuilder::offsets(m.entries, &total);
    buf = gpu::DeviceBuffer::allocate(total, opts_.device, &error);
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (!buf) return give_up("receiving version " + std::to_string(m.version) + ": " + error);
  if (!g.comm->broadcast(buf->data(), total, 0, 0, timeout, &error)) {
    return give_up("receiving version " + std::to_string(m.version) + ": " + error);
  }
  if (version != kLatestVersion && m.version != version) {   // took part in another version's round
    spdlog::info("weights: NCCL group {} broadcast version {}; pulling version {} by the other paths",
                 opts_.nccl_group, m.version, version);
    return nullptr;
  }
  void* data = buf->data();
  return device_set(m, data, total, std::move(buf), opts_);
}

}  // namespace troupe
