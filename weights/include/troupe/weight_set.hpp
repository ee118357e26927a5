// WeightSet (one immutable version) and WeightPublisher (owns versions, pooled buffers, holds).
// See troupe/weights.hpp for the design and the invariants WS-1, WS-2.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <msgpack.hpp>

#include "troupe/tensor.hpp"
#include "troupe/weight_types.hpp"

namespace troupe {

namespace detail::weights { struct SetBuilder; struct DeviceImage; }

// One immutable version. Views share its buffer (no copy); holding the shared_ptr keeps the
// version alive (WS-2). Thread-safe (read-only).
class WeightSet {
 public:
  std::uint64_t version() const { return version_; }
  std::uint64_t checksum() const { return checksum_; }            // over the wire image (WS-1)
  WireCompression compression() const { return compression_; }
  // -1: tensors() view host memory. Otherwise the CUDA device whose memory they view (a
  // subscriber's SubscriberOptions::device); wire() is then empty.
  int device() const { return device_; }
  const std::vector<NamedTensor>& tensors() const { return tensors_; }
  const TensorView* find(const std::string& name) const;           // nullptr when absent
  std::size_t bytes() const { return bytes_; }                      // decoded tensor bytes
  std::size_t wire_bytes() const { return wire_.nbytes(); }         // bytes a transfer moves
  const TensorView& wire() const { return wire_; }                  // U8 [wire_bytes]

 private:
  friend struct detail::weights::SetBuilder;
  std::uint64_t version_ = 0, checksum_ = 0;
  WireCompression compression_ = WireCompression::None;
  std::vector<NamedTensor> tensors_;
  std::size_t bytes_ = 0;
  TensorView wire_;   // == the decoded buffer when uncompressed
  TensorView image_;  // the decoded buffer: tensors_ view into it
  int device_ = -1;
  // A publisher's copy of image_ on its device (PublisherOptions::device), exported by CUDA IPC.
  std::shared_ptr<const detail::weights::DeviceImage> device_image_;
};
using WeightSetPtr = std::shared_ptr<const WeightSet>;

struct PublisherOptions {
  WireCompression compression = WireCompression::None;   // on the wire only
  // A remote transfer's hold (and the exposed region) ends at release() or after this lease:
  // a receiver that died mid-transfer blocks nothing, and its version is freed at the lease.
  std::chrono::milliseconds hold_lease = std::chrono::seconds(60);
  std::size_t idle_buffers = 2;    // freed version buffers kept for the next publish
  // GPU builds, >= 0: each version is also copied once into this CUDA device's memory, where
  // subscribers on this host that ask for device memory (SubscriberOptions::device) take it by
  // CUDA IPC: in place or by one device-to-device copy, never through the host. The constructor
  // throws std::invalid_argument when the build has no CUDA or the machine no such device.
  int device = -1;
  // WeightStore only: SubscriberOptions::map_shared of its follow()/follow_async() pulls. Off by
  // default: a relay re-serves what it pulled, and a mapping would be re-exposed by a copy per
  // child; a store that only consumes may map.
  bool relay_maps = false;

  // msgpack (a WeightStore's constructor argument, so a store in a worker process gets it too):
  // [compression, hold_lease ms, idle_buffers, device, relay_maps]; unpacking refuses a bad
  // compression or a negative lease (DecodeError).
  template <class Packer>
  void msgpack_pack(Packer& pk) const {
    pk.pack_array(5);
    pk.pack(static_cast<std::uint8_t>(compression));
    pk.pack(static_cast<std::int64_t>(hold_lease.count()));
    pk.pack(static_cast<std::uint64_t>(idle_buffers));
    pk.pack(static_cast<std::int32_t>(device));
    pk.pack(relay_maps);
  }
  void msgpack_unpack(const msgpack::object& o);
};

struct PublisherStats {
  std::uint64_t latest = 0;
  std::size_t live_versions = 0;   // versions not yet freed (latest, held, or shared)
  std::size_t holds = 0;           // remote transfers in flight
  std::size_t buffers_allocated = 0;   // shared-memory buffers ever allocated
  std::uint64_t transfers = 0;     // remote transfers ever started (holds granted)
  std::uint64_t streamed = 0;      // WeightStore: transfers of a version still arriving (follow_async)
  std::uint64_t group_broadcasts = 0;   // WeightStore: NCCL group broadcasts completed (group_pull)
  MSGPACK_DEFINE(latest, live_versions, holds, buffers_allocated, transfers, streamed, group_broadcasts);
};

// Owns published versions. publish() copies the tensors once into a pooled shared-memory buffer
// (no new allocation once shapes repeat), checksums them, and makes the version the latest.
// Versions must increase. Thread-safe.
class WeightPublisher {
 public:
  // A publisher that same-process subscribers can find by key() (the no-copy path).
  static std::shared_ptr<WeightPublisher> create(PublisherOptions opts = {});
  explicit WeightPublisher(PublisherOptions opts = {});   // not findable by key()
  ~WeightPublisher();
  WeightPublisher(const WeightPublisher&) = delete;
  WeightPublisher& operator=(const WeightPublisher&) = delete;

  // Throws std::invalid_argument: version not above the latest, repeated/empty name, a tensor
  // without data, compression of a dtype other than f32/bf16.
  WeightSetPtr publish(std::uint64_t version, const std::vector<NamedTensor>& tensors);
  // The same without a staging copy: write(i, dst) fills entry i's contiguous bytes in place
  // (e.g. straight from a device). Same errors as publish().
  WeightSetPtr publish_in_place(std::uint64_t version, const std::vector<WeightEntry>& entries,
                                const std::function<void(std::size_t, void*)>& write);
  // Makes an already-built set (a relay's received copy) the latest, sharing its buffers.
  void adopt(WeightSetPtr set);
  WeightSetPtr latest() const;
  // `version` (kLatestVersion: the latest) if it is still alive, else nullptr.
  WeightSetPtr get(std::uint64_t version) const;
  // Drops the latest reference: versions live on only while someone holds them.
  void clear();

  // Remote transfer holds (used by WeightStore). hold() pins `set` for `subscriber` until
  // release() or the lease, with the data-plane region exposing it; returns the region of a hold
  // it replaced (the same subscriber pulling the same version again), 0 if none.
  // With `holder_pid` (a process on this host that maps the version in place) the hold has no
  // lease: it lasts until release() or that process's death.
  // Returns the replaced hold's region; `*lifetime` (if given) tells whether the hold is tied to
  // the holder's process (false: a lease, e.g. when its process cannot be seen from here).
  std::uint64_t hold(WeightSetPtr set, const std::string& subscriber, std::uint64_t region,
                     std::uint32_t holder_pid = 0, bool* lifetime = nullptr);
  // Ends the hold; returns its data-plane region (0 if none) for the caller to release.
  std::uint64_t release(std::uint64_t version, const std::string& subscriber);
  void sweep();   // ends expired holds (also done by every other call)

  PublisherStats stats() const;
  std::uint64_t key() const { return key_; }   // process-unique, for the same-process path
  const PublisherOptions& options() const { return opts_; }
  static std::shared_ptr<WeightPublisher> find_local(std::uint64_t key);   // nullptr if gone

 private:
  struct State;
  PublisherOptions opts_;
  std::uint64_t key_;
  std::shared_ptr<State> state_;
};

}  // namespace troupe
