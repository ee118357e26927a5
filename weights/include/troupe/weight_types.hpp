// Plain types of the weight store: names, compression, the manifest a transfer starts from,
// errors, and the checksum. See troupe/weights.hpp for the design.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <msgpack.hpp>

#include "troupe/codec.hpp"
#include "troupe/error.hpp"
#include "troupe/tensor.hpp"

namespace troupe {

// "The newest version there is" wherever a version is asked for.
inline constexpr std::uint64_t kLatestVersion = std::numeric_limits<std::uint64_t>::max();

// How a version travels between processes (never applied in-process). f32 and bf16 tensors only.
enum class WireCompression : std::uint8_t {
  None = 0,    // exact
  BF16 = 1,    // f32 rounded to nearest even bf16: |x - x'| <= 2^-8 |x|; bf16 tensors exact
  Int8Row = 2, // per row (dim 0; 1-D = one row): |x - x'| <= 1.0001 * max|row| / 254
};

// A tensor and its name. Packs (msgpack) only inside a call payload, where the view travels as
// a tensor slot (in-process: shared; cross-process: a data-plane descriptor).
struct NamedTensor {
  std::string name;
  TensorView tensor;
  MSGPACK_DEFINE(name, tensor);
};

// Publishers, subscribers and stores fail with troupe::ErrorException of a WeightCode (NotFound,
// Checksum, Transfer, Rejoin: troupe/error.hpp), which reaches a caller of a WeightStore method
// intact, so callers compare codes.

// Who is asking / who publishes: same nonce = same process (the no-copy path).
struct WeightOrigin {
  std::string host;
  std::uint32_t pid = 0;
  std::uint64_t nonce = 0;          // random per process
  // Set by a subscriber that will map a version of a store on its host in place (no copy):
  // its hold then lasts until release() or the subscriber process's death, not a lease.
  bool map = false;
  // Set by a subscriber that wants the version in a CUDA device's memory: that device's UUID
  // (indices differ between processes; the UUID names the GPU). Empty: host memory.
  std::vector<char> device_uuid;
  MSGPACK_DEFINE(host, pid, nonce, map, device_uuid);
  static const WeightOrigin& self();
};

struct WeightEntry {
  std::string name;
  std::uint8_t dtype = 0;           // troupe::DType
  std::vector<std::int64_t> shape;
  MSGPACK_DEFINE(name, dtype, shape);
};

// What WeightStore::manifest answers: everything a receiver needs to pull, check and lay out
// one version. `descriptor` is an encoded data-plane descriptor of the wire image (empty when
// `local`, i.e. caller and store share a process: take the set by `publisher_key`).
struct WeightManifest {
  std::uint64_t version = 0;
  std::uint64_t checksum = 0;
  std::uint8_t compression = 0;     // WireCompression
  std::uint64_t wire_bytes = 0;
  std::vector<WeightEntry> entries;
  WeightOrigin origin;
  std::uint64_t publisher_key = 0;
  bool local = false;
  std::vector<char> descriptor;
  // The caller asked to map (WeightOrigin::map) and its hold lasts while its process lives: only
  // then may it map the version instead of copying it.
  bool held_while_alive = false;
  // GPU builds: the caller asked for memory of a GPU on the store's host that the store mirrors
  // its versions on, and the hold lasts while the caller lives: the CUDA IPC handle of the
  // version's decoded image there (its size follows from `entries`; device_checksum is its
  // weight_checksum). Empty otherwise.
  std::vector<char> device_handle;
  std::uint64_t device_checksum = 0;
  // The version is still arriving at this store (a relay's WeightStore::follow_async): pull a
  // bucket only once WeightStore::progress says its bytes have landed here. Never mapped.
  bool streaming = false;
  std::uint64_t generation = 0;     // streaming: which receive buffer of the relay's (FollowState)
  MSGPACK_DEFINE(version, checksum, compression, wire_bytes, entries, origin, publisher_key, local,
                 descriptor, held_while_alive, device_handle, device_checksum,
                 streaming, generation);
};

// How far a store has `version` (WeightStore::progress): `landed` of `total` wire bytes are
// here, in order from the start; `complete` once it is checked and served like a published one.
struct FollowState {
  std::uint64_t version = 0;
  std::uint64_t landed = 0;
  std::uint64_t total = 0;
  bool complete = false;
  // The relay's receive buffer these bytes are in: it changes when the relay retries the version
  // from another source, and a child streaming the old one must then pull elsewhere.
  std::uint64_t generation = 0;
  MSGPACK_DEFINE(version, landed, total, complete, generation);
};

// WeightStore::group_join's answer: once the group is formed (`ready`), its NCCL id, the caller's
// rank in it (the store is rank 0) and the group's epoch (a group formed anew has a new one).
struct GroupSeat {
  bool ready = false;               // false: the other members are not all here yet; ask again
  std::int64_t retry_in_ms = 0;     // > 0: the group is held off after a failure; come back then
  std::vector<char> id;             // ncclUniqueId, 128 bytes
  std::int32_t rank = 0;
  std::int32_t size = 0;
  std::uint64_t epoch = 0;
  MSGPACK_DEFINE(ready, retry_in_ms, id, rank, size, epoch);
};

// The 64-bit checksum of a version's wire image: XXH64 of each 1 MiB chunk (seed = chunk
// index), folded in order. Chunked so that a receiver hashes each bucket while the next one is
// in flight, with the same result for any bucket size that is a multiple of kChecksumChunk.
inline constexpr std::size_t kChecksumChunk = std::size_t(1) << 20;
std::uint64_t weight_checksum(const void* data, std::size_t n);
// Incremental form: fold chunk hashes of consecutive ranges (each a multiple of
// kChecksumChunk long, except the last) into `state`, starting from checksum_init(total).
std::uint64_t checksum_init(std::size_t total_bytes);
std::uint64_t checksum_update(std::uint64_t state, const void* data, std::size_t n,
                              std::size_t offset);
// The same in two steps, for chunks hashed out of order (on several threads): the hash of chunk
// `index` (at most kChecksumChunk bytes), then the chunks' hashes folded in index order.
std::uint64_t checksum_chunk(const void* data, std::size_t n, std::size_t index);
std::uint64_t checksum_fold(std::uint64_t state, std::uint64_t chunk_hash);

}  // namespace troupe
