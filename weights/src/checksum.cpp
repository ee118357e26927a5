// weight_checksum: XXH64 (Yann Collet's algorithm, reimplemented) per 1 MiB chunk, folded.
// Four independent lanes keep it at memory speed, so checking a version costs one read pass.
#include <unistd.h>

#include <cstring>
#include <random>

#include "troupe/weight_types.hpp"

namespace troupe {
namespace {

constexpr std::uint64_t kP1 = 0x9E3779B185EBCA87ull, kP2 = 0xC2B2AE3D27D4EB4Full,
                        kP3 = 0x165667B19E3779F9ull, kP4 = 0x85EBCA77C2B2AE63ull,
                        kP5 = 0x27D4EB2F165667C5ull;

inline std::uint64_t rotl(std::uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
inline std::uint64_t read64(const unsigned char* p) { std::uint64_t v; std::memcpy(&v, p, 8); return v; }
inline std::uint32_t read32(const unsigned char* p) { std::uint32_t v; std::memcpy(&v, p, 4); return v; }
inline std::uint64_t round64(std::uint64_t acc, std::uint64_t in) { return rotl(acc + in * kP2, 31) * kP1; }
inline std::uint64_t merge(std::uint64_t acc, std::uint64_t v) { return (acc ^ round64(0, v)) * kP1 + kP4; }

std::uint64_t xxh64(const void* data, std::size_t len, std::uint64_t seed) {
  auto* p = static_cast<const unsigned char*>(data);
  const unsigned char* end = p + len;
  std::uint64_t h;
  if (len >= 32) {
    std::uint64_t v1 = seed + kP1 + kP2, v2 = seed + kP2, v3 = seed, v4 = seed - kP1;
    for (; p + 32 <= end; p += 32) {
      v1 = round64(v1, read64(p));
      v2 = round64(v2, read64(p + 8));
      v3 = round64(v3, read64(p + 16));
      v4 = round64(v4, read64(p + 24));
    }
    h = rotl(v1, 1) + rotl(v2, 7) + rotl(v3, 12) + rotl(v4, 18);
    h = merge(merge(merge(merge(h, v1), v2), v3), v4);
  } else {
    h = seed + kP5;
  }
  h += len;
  for (; p + 8 <= end; p += 8) h = rotl(h ^ round64(0, read64(p)), 27) * kP1 + kP4;
  if (p + 4 <= end) { h = rotl(h ^ (read32(p) * kP1), 23) * kP2 + kP3; p += 4; }
  for (; p < end; ++p) h = rotl(h ^ (*p * kP5), 11) * kP1;
  h ^= h >> 33; h *= kP2; h ^= h >> 29; h *= kP3; h ^= h >> 32;
  return h;
}

}  // namespace

std::uint64_t checksum_init(std::size_t total_bytes) { return merge(kP5, total_bytes); }

std::uint64_t checksum_update(std::uint64_t state, const void* data, std::size_t n, std::size_t offset) {
  auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t done = 0; done < n; done += kChecksumChunk) {
    std::size_t len = std::min(kChecksumChunk, n - done);
    state = merge(state, xxh64(p + done, len, (offset + done) / kChecksumChunk));
  }
  return state;
}

std::uint64_t checksum_chunk(const void* data, std::size_t n, std::size_t index) { return xxh64(data, n, index); }

std::uint64_t checksum_fold(std::uint64_t state, std::uint64_t chunk_hash) { return merge(state, chunk_hash); }

std::uint64_t weight_checksum(const void* data, std::size_t n) {
  return checksum_update(checksum_init(n), data, n, 0);
}

const WeightOrigin& WeightOrigin::self() {
  static const WeightOrigin origin = [] {
    WeightOrigin o;
    char host[256] = {};
    if (::gethostname(host, sizeof host - 1) == 0) o.host = host;
    o.pid = static_cast<std::uint32_t>(::getpid());
    std::random_device rd;
    o.nonce = (std::uint64_t(rd()) << 32) ^ rd() ^ (std::uint64_t(o.pid) << 16);
    return o;
  }();
  return origin;
}

}  // namespace troupe
