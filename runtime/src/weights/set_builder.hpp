// Builds WeightSets: from a publisher's tensors (one copy into a pooled buffer, optional wire
// compression, checksum) and from a received, already-verified wire image (views into it, or
// decompression into a second pooled buffer). The layouts are pure functions of the entries, so
// the manifest carries only names, dtypes and shapes.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "troupe/weight_set.hpp"
#include "weights/buffer_pool.hpp"

namespace troupe::detail::weights {

inline constexpr std::size_t kAlign = 256;   // tensor offsets in the decoded image

struct SetBuilder {
  // Offsets of each entry in the decoded image; `total` gets its size.
  static std::vector<std::size_t> offsets(const std::vector<WeightEntry>& entries, std::size_t* total);
  // Bytes of the wire image of `entries` under `c`. Throws std::invalid_argument when `c` cannot
  // encode a dtype.
  static std::size_t wire_bytes(const std::vector<WeightEntry>& entries, WireCompression c);

  // Fills a pooled buffer by calling write(i, dst) for each entry (dst: its contiguous bytes in
  // the decoded image), encodes the wire image and checksums it.
  static WeightSetPtr build(std::uint64_t version, const std::vector<WeightEntry>& entries,
                            WireCompression c, BufferPool& pool,
                            const std::function<void(std::size_t, void*)>& write);
  // A set over a received wire image whose checksum was verified; decodes it when compressed.
  static WeightSetPtr from_wire(std::uint64_t version, std::uint64_t checksum,
                                const std::vector<WeightEntry>& entries, WireCompression c,
                                TensorView wire, BufferPool& pool);
  static std::vector<WeightEntry> entries_of(const WeightSet& s);
  static std::vector<WeightEntry> entries_of(const std::vector<NamedTensor>& tensors);
};

}  // namespace troupe::detail::weights
