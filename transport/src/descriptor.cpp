#include "troupe/transport/descriptor.hpp"

#include <cstring>

#include "troupe/transport/data_plane.hpp"

// Layout, version 1, all integers little-endian:
//   u32 magic 'TRTD' | u8 version | u8 flags (bit 0: inline) | u8 dtype | u8 ndim
//   i64 shape[ndim] | u64 nbytes
//   inline: u32 len | len bytes        (len == nbytes <= kLaneInlineMaxBytes, 512 KiB)
//   remote: u64 region | u32 owner_pid | u64 remote_address
//           u16 address_len | address bytes | u16 rkey_len | rkey bytes
namespace troupe::transport {
namespace {

constexpr std::uint32_t kMagic = 0x44545254;   // "TRTD"
constexpr std::uint8_t kVersion = 1;
constexpr std::uint8_t kFlagInline = 1;
constexpr std::uint64_t kMaxBytes = std::uint64_t(1) << 62;

[[noreturn]] void bad(const std::string& why) {
  throw ErrorException(Error{TransportCode::BadDescriptor, "tensor descriptor: " + why});
}

class Writer {
 public:
  explicit Writer(std::vector<char>& out) : out_(out) {}
  template <class T> void put(T v) {
    for (std::size_t i = 0; i < sizeof(T); ++i) out_.push_back(char((std::uint64_t(v) >> (8 * i)) & 0xff));
  }
  void bytes(const std::vector<char>& b) { out_.insert(out_.end(), b.begin(), b.end()); }

 private:
  std::vector<char>& out_;
};

class Reader {
 public:
  Reader(const char* p, std::size_t n) : p_(p), n_(n) {}
  template <class T> T get() {
    need(sizeof(T));
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < sizeof(T); ++i) v |= std::uint64_t(std::uint8_t(p_[i])) << (8 * i);
    advance(sizeof(T));
    return static_cast<T>(v);
  }
  std::vector<char> bytes(std::size_t len) {
    const char* at = skip(len);
    return std::vector<char>(at, at + len);
  }
  const char* skip(std::size_t len) {   // the next `len` bytes, where they are
    need(len);
    const char* at = p_;
    advance(len);
    return at;
  }
  bool done() const { return n_ == 0; }

 private:
  void need(std::size_t k) const { if (k > n_) bad("truncated"); }
  void advance(std::size_t k) { p_ += k; n_ -= k; }
  const char* p_;
  std::size_t n_;
};

// `inline_size`: the inline bytes' count (held in the descriptor or, decoded as a view, not).
void check_limits(const TensorDescriptor& d, std::size_t inline_size) {
  if (d.shape.size() > kMaxDims) bad("too many dimensions");
  if (checked_nbytes(d.dtype, d.shape) != d.nbytes) bad("nbytes does not match dtype and shape");
  if (d.is_inline) {
    if (d.nbytes > kLaneInlineMaxBytes || inline_size != d.nbytes) bad("bad inline length");
    return;
  }
  if (d.worker_address.empty() || d.worker_address.size() > kMaxWorkerAddressBytes) bad("bad worker address length");
  if (d.rkey.empty() || d.rkey.size() > kMaxRkeyBytes) bad("bad rkey length");
  if (d.region == 0) bad("remote descriptor without a region");
  if (d.remote_address + d.nbytes < d.remote_address) bad("remote range wraps");
}
void check_limits(const TensorDescriptor& d) { check_limits(d, d.inline_bytes.size()); }

// The fields every descriptor starts with.
void put_head(Writer& w, DType dtype, const std::vector<std::int64_t>& shape, std::uint64_t nbytes, bool is_inline) {
  w.put(kMagic);
  w.put(kVersion);
  w.put(std::uint8_t(is_inline ? kFlagInline : 0));
  w.put(std::uint8_t(dtype));
  w.put(std::uint8_t(shape.size()));
  for (auto dim : shape) w.put(std::uint64_t(dim));
  w.put(nbytes);
}

}  // namespace

std::uint64_t checked_nbytes(DType dtype, const std::vector<std::int64_t>& shape) {
  std::uint64_t n = dtype_size(dtype);
  for (auto dim : shape) {
    if (dim < 0) bad("negative dimension");
    if (dim != 0 && n > kMaxBytes / std::uint64_t(dim)) bad("tensor too large");
    n *= std::uint64_t(dim);
  }
  return n;
}

std::vector<char> encode(const TensorDescriptor& d) {
  check_limits(d);
  std::vector<char> out;
  out.reserve(64 + d.shape.size() * 8 + d.inline_bytes.size() + d.worker_address.size() + d.rkey.size());
  Writer w(out);
  put_head(w, d.dtype, d.shape, d.nbytes, d.is_inline);
  if (d.is_inline) {
    w.put(std::uint32_t(d.inline_bytes.size()));
    w.bytes(d.inline_bytes);
    return out;
  }
  w.put(d.region);
  w.put(d.owner_pid);
  w.put(d.remote_address);
  w.put(std::uint16_t(d.worker_address.size()));
  w.bytes(d.worker_address);
  w.put(std::uint16_t(d.rkey.size()));
  w.bytes(d.rkey);
  return out;
}

std::vector<char> encode_inline(const TensorView& t) {
  if (t.shape.size() > kMaxDims) bad("too many dimensions");
  const std::uint64_t n = checked_nbytes(t.dtype, t.shape);
  if (n > kLaneInlineMaxBytes) bad("inline payload too large");
  if (n > 0 && t.data == nullptr) bad("tensor view without data");
  if (n > 0 && !t.is_contiguous()) return encode(inline_descriptor(t));   // strided: gathered there first
  std::vector<char> out;
  out.reserve(64 + t.shape.size() * 8 + n);
  Writer w(out);
  put_head(w, t.dtype, t.shape, n, true);
  w.put(std::uint32_t(n));
  const char* from = static_cast<const char*>(t.data);
  if (n > 0) out.insert(out.end(), from, from + n);
  return out;
}

DescriptorView decode_descriptor_view(const char* data, std::size_t size) {
  if (data == nullptr && size != 0) bad("null bytes");
  Reader r(data, size);
  if (r.get<std::uint32_t>() != kMagic) bad("bad magic");
  if (auto v = r.get<std::uint8_t>(); v != kVersion) bad("unsupported version " + std::to_string(v));
  auto flags = r.get<std::uint8_t>();
  if (flags & ~kFlagInline) bad("unknown flags");
  auto dtype = r.get<std::uint8_t>();
  if (!dtype_valid(dtype)) bad("unknown dtype");
  auto ndim = r.get<std::uint8_t>();
  if (ndim > kMaxDims) bad("too many dimensions");
  TensorDescriptor d;
  d.dtype = DType(dtype);
  d.is_inline = (flags & kFlagInline) != 0;
  for (std::uint8_t i = 0; i < ndim; ++i) d.shape.push_back(std::int64_t(r.get<std::uint64_t>()));
  d.nbytes = r.get<std::uint64_t>();
  DescriptorView v;
  std::size_t inline_size = 0;
  if (d.is_inline) {
    auto len = r.get<std::uint32_t>();
    if (len > kLaneInlineMaxBytes) bad("inline payload too large");
    v.inline_data = r.skip(len);
    inline_size = len;
  } else {
    d.region = r.get<std::uint64_t>();
    d.owner_pid = r.get<std::uint32_t>();
    d.remote_address = r.get<std::uint64_t>();
    d.worker_address = r.bytes(r.get<std::uint16_t>());
    d.rkey = r.bytes(r.get<std::uint16_t>());
  }
  if (!r.done()) bad("trailing bytes");
  check_limits(d, inline_size);
  v.descriptor = std::move(d);
  return v;
}

TensorDescriptor decode_descriptor(const char* data, std::size_t size) {
  DescriptorView v = decode_descriptor_view(data, size);
  if (v.descriptor.is_inline) v.descriptor.inline_bytes.assign(v.inline_data, v.inline_data + v.descriptor.nbytes);
  return std::move(v.descriptor);
}

}  // namespace troupe::transport
