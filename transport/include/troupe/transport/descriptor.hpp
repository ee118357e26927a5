// A tensor as it crosses processes: a small, plain descriptor that travels inside a control
// message, and whose bytes the receiver pulls over UCX (or finds inline when small).
//
// Wire format (version 1, little-endian, see descriptor.cpp for the exact layout) is decoded
// from untrusted bytes with every length bounded; anything malformed throws TransportError.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "troupe/error.hpp"
#include "troupe/tensor.hpp"

namespace troupe::transport {

// Every data-plane failure throws troupe::ErrorException with a TransportCode: bad descriptor
// bytes (BadDescriptor), a peer gone (PeerGone), a deadline passed (Timeout), a region no longer
// exposed (Released), any other UCX failure (Ucx).

// Identifies one exposed region inside its owner process; 0 means "nothing to release"
// (inline descriptors).
using RegionId = std::uint64_t;

inline constexpr std::size_t kInlineMaxBytes = 64 * 1024;   // tensors up to this travel inline
// ...and up to this on a link with a shared-memory lane (same host), where the message's copies cost
// less than the data plane's pull, its release notice and a thread woken for each (~0.5 ms a call
// on a small VM); what a receiver accepts inline.
inline constexpr std::size_t kLaneInlineMaxBytes = 512 * 1024;
inline constexpr std::size_t kMaxDims = 16;
inline constexpr std::size_t kMaxWorkerAddressBytes = 4096;  // UCX's is ~215 B on one host
inline constexpr std::size_t kMaxRkeyBytes = 4096;           // UCX's is ~12-100 B

// Always describes a contiguous, row-major tensor (strides are not sent).
struct TensorDescriptor {
  DType dtype = DType::F32;
  std::vector<std::int64_t> shape;
  std::uint64_t nbytes = 0;                 // == numel * dtype_size, checked on decode

  bool is_inline = false;
  std::vector<char> inline_bytes;           // exactly nbytes when is_inline

  // Remote form (empty / zero when is_inline):
  RegionId region = 0;                      // owner's handle, for its release()
  std::uint32_t owner_pid = 0;              // diagnostics only
  std::vector<char> worker_address;         // owner's UCP worker address (opaque)
  std::uint64_t remote_address = 0;         // start of the bytes in the owner's address space
  std::vector<char> rkey;                   // packed UCP rkey covering [remote_address, +nbytes)
};

// Serialises `d` (a few hundred bytes for a remote descriptor). Throws ErrorException
// (BadDescriptor) if `d` breaks the limits above.
std::vector<char> encode(const TensorDescriptor& d);

// The encoding of an inline descriptor of a contiguous copy of `t` (encode(inline_descriptor(t))),
// its bytes written once, straight into the result. Throws ErrorException (BadDescriptor) past
// kLaneInlineMaxBytes or for a view without data.
std::vector<char> encode_inline(const TensorView& t);

// A decoded descriptor whose inline bytes stay where they are: `inline_data` points at the
// descriptor.nbytes of them inside the bytes decoded (descriptor.inline_bytes is left empty),
// valid while those are. Null for a remote descriptor.
struct DescriptorView {
  TensorDescriptor descriptor;
  const char* inline_data = nullptr;
};

// Decodes untrusted bytes: version, dtype, dims, sizes and lengths are all checked, trailing
// bytes are rejected. Throws TransportError(BadDescriptor); never reads out of bounds.
DescriptorView decode_descriptor_view(const char* data, std::size_t size);
// The same, the inline bytes copied into the descriptor.
TensorDescriptor decode_descriptor(const char* data, std::size_t size);
inline TensorDescriptor decode_descriptor(const std::vector<char>& b) {
  return decode_descriptor(b.data(), b.size());
}

// numel * dtype_size of `shape`, or throws TransportError(BadDescriptor) on a negative
// dimension or overflow past 2^62 bytes.
std::uint64_t checked_nbytes(DType dtype, const std::vector<std::int64_t>& shape);

}  // namespace troupe::transport
