// Builds WeightSets: from a publisher's tensors (one copy into a pooled buffer, optional wire
// compression, checksum) and from a received, already-verified wire image (views into it, or
// decompression into a second pooled buffer). The layouts are pure functions of the entries, so
// the manifest carries only names, dtypes and shapes.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "troupe/weight_set.hpp"
#include "buffer_pool.hpp"
#include "gpu_sync.hpp"

namespace troupe::detail::weights {

inline constexpr std::size_t kAlign = 256;   // tensor offsets in the decoded image

// A publisher's copy of a version's decoded image on a CUDA device, exported to other processes.
struct DeviceImage {
  std::shared_ptr<gpu::DeviceBuffer> buffer;
  gpu::IpcHandle handle;
  std::array<char, 16> uuid{};  // the device's (gpu::device_uuid)
  std::uint64_t checksum = 0;   // weight_checksum of the decoded image
};

struct SetBuilder {
  // Offsets of each entry in the decoded image; `total` gets its size.
  static std::vector<std::size_t> offsets(const std::vector<WeightEntry>& entries, std::size_t* total);
  // Bytes of the wire image of `entries` under `c`. Throws std::invalid_argument when `c` cannot
  // encode a dtype.
  static std::size_t wire_bytes(const std::vector<WeightEntry>& entries, WireCompression c);

  // Fills a pooled buffer by calling write(i, dst) for each entry (dst: its contiguous bytes in
  // the decoded image), encodes the wire image and checksums it.
  // With `device` >= 0 the decoded image is also copied to that CUDA device and exported
  // (WeightSet's DeviceImage). Throws std::runtime_error when that fails.
  static WeightSetPtr build(std::uint64_t version, const std::vector<WeightEntry>& entries,
                            WireCompression c, BufferPool& pool,
                            const std::function<void(std::size_t, void*)>& write, int device = -1);
  // A set over a received wire image whose checksum was verified; decodes it when compressed.
  static WeightSetPtr from_wire(std::uint64_t version, std::uint64_t checksum,
                                const std::vector<WeightEntry>& entries, WireCompression c,
                                TensorView wire, BufferPool& pool);
  // A set whose tensors view a decoded image at `data` in CUDA device `device`'s memory, kept
  // alive by `keep`.
  static WeightSetPtr on_device(std::uint64_t version, std::uint64_t checksum, const std::vector<WeightEntry>& entries,
                                WireCompression c, void* data, int device, std::shared_ptr<void> keep);
  // `host`'s decoded image copied to `device` (or, when `host` is mirrored on `device`, a view
  // of that mirror). Throws ErrorException(WeightCode::Transfer) when the device cannot take it.
  static WeightSetPtr to_device(const WeightSetPtr& host, int device);
  static const DeviceImage* device_image(const WeightSet& s) { return s.device_image_.get(); }
  // Throws std::invalid_argument unless `device` is -1 or a CUDA device of this build and machine.
  static void check_device(int device, const char* who);
  static std::vector<WeightEntry> entries_of(const WeightSet& s);
  static std::vector<WeightEntry> entries_of(const std::vector<NamedTensor>& tensors);

 private:
  // A set's header for a version that arrived (no tensors yet): version, checksum, compression and
  // the decoded size of `entries`.
  static std::shared_ptr<WeightSet> received(std::uint64_t version, std::uint64_t checksum,
                                             const std::vector<WeightEntry>& entries, WireCompression c);
};

}  // namespace troupe::detail::weights
