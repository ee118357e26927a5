#include "troupe/net/frames.hpp"

#include <msgpack.hpp>

#include <algorithm>
#include <stdexcept>

namespace troupe::net {
namespace {

constexpr std::size_t kMaxBody = std::size_t(0xFFFFFFFFu);

struct FrameBuffer {   // msgpack's write target
  std::vector<char> bytes;
  void write(const char* p, std::size_t n) { bytes.insert(bytes.end(), p, p + n); }
};

void pack_bytes(msgpack::packer<FrameBuffer>& pk, const std::vector<char>& b) {
  if (b.size() > kMaxBody) throw std::length_error("a field over 4 GiB");
  pk.pack_bin(std::uint32_t(b.size()));
  pk.pack_bin_body(b.data(), std::uint32_t(b.size()));
}

void pack_byte_lists(msgpack::packer<FrameBuffer>& pk, const std::vector<std::vector<char>>& lists) {
  pk.pack_array(std::uint32_t(lists.size()));
  for (const auto& b : lists) pack_bytes(pk, b);
}

// A frame's bytes besides its strings and byte fields (at most: ints, headers), and those of a list
// of byte fields: what encode_* reserves, so that the frame is written once, not regrown.
constexpr std::size_t kFrameOverhead = 96;
std::size_t listed_size(const std::vector<std::vector<char>>& lists) {
  std::size_t n = 5;
  for (const auto& b : lists) n += 5 + b.size();
  return n;
}

const msgpack::object* fields(const msgpack::object& o, std::uint32_t n) {
  if (o.type != msgpack::type::ARRAY || o.via.array.size != n) throw std::runtime_error("malformed frame");
  return o.via.array.ptr;
}

std::vector<char> bytes_of(const msgpack::object& o) {
  if (o.type != msgpack::type::BIN) throw std::runtime_error("malformed frame: expected bytes");
  return std::vector<char>(o.via.bin.ptr, o.via.bin.ptr + o.via.bin.size);
}

std::vector<std::vector<char>> byte_lists_of(const msgpack::object& o) {
  if (o.type != msgpack::type::ARRAY) throw std::runtime_error("malformed frame: expected a list");
  std::vector<std::vector<char>> out;
  out.reserve(o.via.array.size);
  for (std::uint32_t i = 0; i < o.via.array.size; ++i) out.push_back(bytes_of(o.via.array.ptr[i]));
  return out;
}

template <class T>
T as(const msgpack::object& o) {
  try {
    return o.as<T>();
  } catch (const msgpack::type_error&) {
    throw std::runtime_error("malformed frame: a field has the wrong type");
  }
}

// Strings and bytes in the object point into `data` rather than into copies in its zone: every
// decode_* below copies what it keeps out before `data` goes (one copy of an argument's or a
// result's bytes, not two).
bool in_place(msgpack::type::object_type type, std::size_t, void*) {
  return type == msgpack::type::BIN || type == msgpack::type::STR;
}

msgpack::object_handle unpack(const char* data, std::size_t size) {
  static const msgpack::unpack_limit kLimits(/*array*/ 1u << 20, /*map*/ 16, /*str*/ 1u << 30,
                                             /*bin*/ 0xFFFFFFFFu, /*ext*/ 0, /*depth*/ 4);
  try {
    std::size_t off = 0;
    auto h = msgpack::unpack(data, size, off, in_place, nullptr, kLimits);
    if (off != size) throw std::runtime_error("malformed frame: trailing bytes");
    return h;
  } catch (const std::runtime_error&) {
    throw;
  } catch (const std::exception& e) {   // msgpack's own errors (insufficient bytes, limits, ...)
    throw std::runtime_error(std::string("malformed frame: ") + e.what());
  }
}

}  // namespace

void ReplyFrame::set_error(const Error& e) {
  error_domain = static_cast<std::uint8_t>(e.code.domain());
  error_code = e.code.value();
  error = e.message;
}

Error ReplyFrame::error_value() const {
  Code code = Code::from_wire(error_domain, error_code);
  if (static_cast<std::uint8_t>(code.domain()) != error_domain || code.value() != error_code) {
    return Error{code, "unknown error code " + std::to_string(error_domain) + "." + std::to_string(error_code) +
                       ": " + error};
  }
  return Error{code, error};
}

std::vector<char> encode_call(const CallFrame& c) {
  FrameBuffer buf;
  buf.bytes.reserve(kFrameOverhead + c.method.size() + c.args.size() + listed_size(c.tensors));
  msgpack::packer<FrameBuffer> pk(buf);
  pk.pack_array(6);
  pk.pack(c.actor_id);
  pk.pack(c.incarnation);
  pk.pack(c.seq);
  pk.pack(c.method);
  pack_bytes(pk, c.args);
  pack_byte_lists(pk, c.tensors);
  if (buf.bytes.size() > kMaxBody) throw std::length_error("a call over 4 GiB");
  return std::move(buf.bytes);
}

CallFrame decode_call(const char* data, std::size_t size) {
  auto h = unpack(data, size);
  const auto* f = fields(h.get(), 6);
  CallFrame c;
  c.actor_id = as<std::uint64_t>(f[0]);
  c.incarnation = as<std::uint64_t>(f[1]);
  c.seq = as<std::uint64_t>(f[2]);
  c.method = as<std::string>(f[3]);
  c.args = bytes_of(f[4]);
  c.tensors = byte_lists_of(f[5]);
  return c;
}

std::vector<char> encode_reply(const ReplyFrame& r) {
  FrameBuffer buf;
  buf.bytes.reserve(kFrameOverhead + r.error.size() + r.result.size() + listed_size(r.tensors));
  msgpack::packer<FrameBuffer> pk(buf);
  pk.pack_array(8);
  pk.pack(r.actor_id);
  pk.pack(r.incarnation);
  pk.pack(r.seq);
  pk.pack(r.error_domain);
  pk.pack(r.error_code);
  pk.pack(r.error);
  pack_bytes(pk, r.result);
  pack_byte_lists(pk, r.tensors);
  if (buf.bytes.size() > kMaxBody) throw std::length_error("a reply over 4 GiB");
  return std::move(buf.bytes);
}

ReplyFrame decode_reply(const char* data, std::size_t size) {
  auto h = unpack(data, size);
  const auto* f = fields(h.get(), 8);
  ReplyFrame r;
  r.actor_id = as<std::uint64_t>(f[0]);
  r.incarnation = as<std::uint64_t>(f[1]);
  r.seq = as<std::uint64_t>(f[2]);
  r.error_domain = as<std::uint8_t>(f[3]);
  r.error_code = as<std::uint16_t>(f[4]);
  r.error = as<std::string>(f[5]);
  r.result = bytes_of(f[6]);
  r.tensors = byte_lists_of(f[7]);
  return r;
}

}  // namespace troupe::net
