#pragma once
// Kernel 5: packing named tensors into one contiguous bucket for weight transfer, optionally
// quantised on the wire (bf16, or int8 with one fp32 scale per row), and unpacking them back.
// The layout (names, shapes, offsets) is plain data: the transport ships it beside the bucket.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "troupe/kernels/types.hpp"

namespace troupe::kernels {

enum class DType : std::uint8_t { kF32, kBF16 };  // element type of a tensor in memory

enum class WireFormat : std::uint8_t {
  kF32,      // exact copy (4 bytes per element)
  kBF16,     // round to nearest even; |x - x'| <= 2^-8 |x| (exact when the tensor is bf16)
  kInt8Row,  // q = rint(x * 127 / amax_row), scale = amax_row / 127 per row;
             // |x - x'| <= 1.0001 * amax_row / 254 (half a step, plus fp32 rounding)
};

inline constexpr std::size_t kBucketAlign = 256;  // every entry starts at a multiple of this

struct TensorSpec {
  std::string name;
  std::int64_t rows = 1;  // a 1-D tensor is one row; int8 scales are per row
  std::int64_t cols = 0;
  DType dtype = DType::kF32;
  WireFormat wire = WireFormat::kBF16;
  std::int64_t numel() const { return rows * cols; }
};

// One tensor's place in the bucket. For kInt8Row the entry holds float scales[rows] at `offset`,
// then int8 values [rows x cols] at `offset + data_offset`; otherwise data_offset is 0.
struct BucketEntry {
  TensorSpec spec;
  std::size_t offset = 0;
  std::size_t data_offset = 0;
  std::size_t bytes = 0;  // bytes this entry uses from `offset` (before padding)
};

struct BucketLayout {
  std::vector<BucketEntry> entries;  // in the order of the specs given to plan_bucket
  std::size_t bytes = 0;             // total bucket size, a multiple of kBucketAlign
  const BucketEntry* find(std::string_view name) const;  // nullptr when absent; linear scan
};

// Lays the specs out back to back, each aligned to kBucketAlign. Fails (kBadArguments) on a
// negative size, an empty or repeated name.
Status plan_bucket(std::span<const TensorSpec> specs, BucketLayout* layout);

// tensors[i] points at entry i's contiguous [rows x cols] data of dtype spec.dtype; bucket holds
// layout.bytes. Padding bytes are zeroed so equal inputs give byte-equal buckets.
// Multithreaded over entries and rows.
Status pack_bucket(const BucketLayout& layout, std::span<const void* const> tensors,
                   std::byte* bucket);

// The inverse: writes each entry, dequantised, into tensors[i] (dtype spec.dtype).
Status unpack_bucket(const BucketLayout& layout, const std::byte* bucket,
                     std::span<void* const> tensors);

}  // namespace troupe::kernels
