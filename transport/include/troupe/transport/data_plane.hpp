// The tensor data plane: makes tensors readable by other processes and pulls theirs, over UCX
// (shared memory or CMA on one host, TCP across hosts). One per process (instance()); tests and
// benchmarks may make their own.
//
// Keep-alive rule (DP-1): an exposed region, and the tensor bytes it names, stay alive until
// the first of
//   (a) release(region) by the owner — the control plane calls it once the receiver has the
//       bytes (its reply or ack arrived) or is known dead (CAF monitor fired);
//   (b) the region's lease passing (ExposeOptions::lease, default 5 min), swept about once a
//       second — the fallback when neither the ack nor the death notice ever comes;
//   (c) the DataPlane's destruction.
// A fetch that starts after (a)-(c) fails or, on CMA, may read whatever the owner keeps at that
// address by then: owners must not release before the receiver is done.
// The owner must not write into an exposed tensor before it is released (the receiver reads the
// live bytes), unless it was exposed with `snapshot`.
//
// Thread safety: every public method may be called from any thread concurrently.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "troupe/transport/descriptor.hpp"
#include "troupe/tensor.hpp"

namespace troupe::transport {

class UcxContext;
class UcxEngine;
class BufferPool;

// `t`'s bytes in the descriptor itself (row-major, whatever its strides): what expose() gives for
// tensors of <= kInlineMaxBytes, and what a sender may give for bigger ones on a link that carries
// them cheaply (up to kLaneInlineMaxBytes). No UCX, no region. Throws TransportError
// (BadDescriptor) on an impossible view.
TensorDescriptor inline_descriptor(const TensorView& t);

struct ExposeOptions {
  std::chrono::milliseconds lease = std::chrono::minutes(5);   // DP-1 (b)
  // Copy the bytes into a fresh UCP-allocated region even when `t` already lies in one, so the
  // caller may write to its tensor at once. (Views outside allocate() buffers are always copied.)
  bool snapshot = false;
};

struct DataPlaneStats {
  std::size_t regions = 0;           // exposed, not yet released
  std::size_t region_bytes = 0;
  std::size_t allocations = 0;       // live allocate() buffers
  std::size_t cached_receive_bytes = 0;   // freed fetch() buffers kept for reuse (<= 2 GiB, 10 s)
};

class DataPlane {
 public:
  // The process-wide instance, created on first use (starts the UCX progress thread). Throws
  // TransportError(Ucx) if UCX cannot start; later calls retry.
  static DataPlane& instance();

  DataPlane();    // throws TransportError(Ucx)
  ~DataPlane();   // releases every region, joins the progress thread; allocations stay valid
  DataPlane(const DataPlane&) = delete;
  DataPlane& operator=(const DataPlane&) = delete;

  // A contiguous, 64-byte-aligned, zeroed tensor in UCP-allocated shared memory: exposing it (or
  // any contiguous view inside it) costs no copy and no registration, and peers on this host
  // read it at memcpy speed. The view's keep_alive owns the memory (it may outlive this object).
  TensorView allocate(DType dtype, std::vector<std::int64_t> shape);

  // Makes `t` readable by other processes (see DP-1). Tensors of <= kInlineMaxBytes come back
  // inline (region 0, nothing to release). A contiguous view inside an allocate() buffer is
  // exposed as is: no copy, no registration (`t.keep_alive` is held). Anything else — ordinary
  // memory, non-contiguous views, or `snapshot` — is first copied once into a fresh allocate()
  // buffer. (Registering ordinary memory in place was measured and rejected: UCX 1.13 with the
  // RMA feature alone has no CMA lane for gets, so such gets fall back to software RMA served by
  // the owner's progress thread, 0.06-5 GB/s, erratic.)
  // Throws TransportError (Ucx when UCP cannot allocate, BadDescriptor on an impossible view).
  TensorDescriptor expose(const TensorView& t, const ExposeOptions& opts = {});

  // Ends DP-1 for `region` now. Unknown ids (already released, expired, 0) are ignored.
  void release(RegionId region);

  // Pulls the bytes `d` names into a new contiguous, 64-byte-aligned tensor (its buffer may be
  // one a dropped fetch() result left in the receive pool). Blocks at most
  // `timeout` (plus the time a copy already under way takes to stop); then throws
  // TransportError(Timeout). Also throws PeerGone (owner unreachable, dead, or region gone),
  // BadDescriptor, Ucx. Never crashes on a bad descriptor; decoded ones were checked already.
  TensorView fetch(const TensorDescriptor& d, std::chrono::milliseconds timeout);

  // As fetch, into `dst` (contiguous, exactly d.nbytes bytes; dtype and shape are not checked).
  // `dst.keep_alive` is held until UCX is done with the memory, even past a timeout; a borrowed
  // `dst` (no keep_alive) must stay valid until this returns, and this waits for that.
  void fetch_into(const TensorDescriptor& d, const TensorView& dst, std::chrono::milliseconds timeout);

  // Maps the bytes `d` names into this process without copying, when the owner's memory is
  // shared memory on this host that UCX can address here: a U8 view whose keep_alive keeps the
  // mapping. An empty view (data == nullptr) when it cannot be mapped (another host, a TCP-only
  // or CMA-only transport, inline); the caller then fetches. The owner must keep the memory
  // unchanged and allocated while the view lives (its exposure or a hold of its own).
  // Throws TransportError(Timeout, PeerGone) as fetch does.
  TensorView map(const TensorDescriptor& d, std::chrono::milliseconds timeout);

  DataPlaneStats stats() const;
  const std::vector<char>& worker_address() const;

 private:
  struct Region;
  struct Allocations;

  TensorDescriptor remote_descriptor(const TensorView& t, const std::vector<char>& rkey, RegionId id);
  RegionId add_region(std::shared_ptr<Region> r);
  void sweep_expired();
  void drop(std::shared_ptr<Region> r);

  std::shared_ptr<UcxContext> ctx_;
  std::shared_ptr<Allocations> allocations_;   // shared with allocate() buffers' deleters
  std::shared_ptr<BufferPool> pool_;           // fetch() buffers
  mutable std::mutex mu_;                      // guards regions_ and next_id_
  std::map<RegionId, std::shared_ptr<Region>> regions_;
  RegionId next_id_ = 1;
  std::unique_ptr<UcxEngine> engine_;          // last member: its thread stops first
};

}  // namespace troupe::transport
