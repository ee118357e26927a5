// Call arguments and results as msgpack bytes plus a side table of tensors. A TensorView inside
// an argument is packed as a small ext record naming its slot in `Payload::tensors`, so the same
// bytes work in-process (the slot holds the view itself: no copy) and across processes (the
// transport turns each slot into a descriptor and the receiver pulls the bytes).
// User structs take part through MSGPACK_DEFINE / MSGPACK_DEFINE_MAP.
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <msgpack.hpp>

#include "troupe/error.hpp"
#include "troupe/tensor.hpp"

namespace troupe {

// What one call or reply carries.
struct Payload {
  std::vector<char> bytes;            // msgpack
  std::vector<TensorView> tensors;    // referenced from `bytes` by slot
};

// Thrown when bytes do not decode to the expected types: an ErrorException of BadArguments whose
// message says what did not match.
class DecodeError : public ErrorException {
 public:
  explicit DecodeError(const std::string& what) : ErrorException(Error{ErrorCode::BadArguments, what}) {}
};

namespace detail {

inline constexpr std::int8_t kTensorExt = 1;      // [u32 slot]
inline constexpr std::int8_t kActorRefExt = 2;    // [u64 actor id, little-endian]

// Appends msgpack output to a std::vector<char> (the packer's Stream concept).
struct VectorWriter {
  std::vector<char>* out;
  void write(const char* p, std::size_t n) { out->insert(out->end(), p, p + n); }
};

// The tensor table that TensorView's msgpack adaptor reads and writes on this thread.
// Set for the duration of one encode or decode by CodecScope.
std::vector<TensorView>*& codec_tensors();

class CodecScope {
 public:
  explicit CodecScope(std::vector<TensorView>* t) : prev_(codec_tensors()) { codec_tensors() = t; }
  ~CodecScope() { codec_tensors() = prev_; }
  CodecScope(const CodecScope&) = delete;
  CodecScope& operator=(const CodecScope&) = delete;

 private:
  std::vector<TensorView>* prev_;
};

// Parses bytes with bounded sizes (a hostile header cannot make us allocate gigabytes) into a
// zone reused across calls on this thread. The object is valid while this lives. Throws
// DecodeError.
class Parsed {
 public:
  explicit Parsed(const std::vector<char>& bytes);
  ~Parsed();
  Parsed(const Parsed&) = delete;
  Parsed& operator=(const Parsed&) = delete;
  const msgpack::object& get() const { return object_; }

 private:
  void release();
  msgpack::zone* zone_;
  std::unique_ptr<msgpack::zone> own_;   // when the thread's zone is already in use (nesting)
  msgpack::object object_;
};

template <class T>
void convert_checked(const msgpack::object& o, T& out) {
  try {
    o.convert(out);
  } catch (const msgpack::type_error&) {
    throw DecodeError("value does not match the expected type");
  }
}

template <class Tuple, std::size_t... I>
void convert_elements(const msgpack::object& o, Tuple& t, std::index_sequence<I...>) {
  (convert_checked(o.via.array.ptr[I], std::get<I>(t)), ...);
}

}  // namespace detail

// Packs `args` as one msgpack array.
template <class... Args>
Payload encode_args(const Args&... args) {
  Payload p;
  p.bytes.reserve(64);
  detail::CodecScope scope(&p.tensors);
  detail::VectorWriter w{&p.bytes};
  msgpack::packer<detail::VectorWriter> pk(w);
  pk.pack_array(sizeof...(Args));
  (pk.pack(args), ...);
  return p;
}

// Packs one value (a call's result).
template <class T>
Payload encode_value(const T& value) {
  Payload p;
  p.bytes.reserve(32);
  detail::CodecScope scope(&p.tensors);
  detail::VectorWriter w{&p.bytes};
  msgpack::packer<detail::VectorWriter> pk(w);
  pk.pack(value);
  return p;
}

// Decodes an array of exactly sizeof...(Args) elements. Throws DecodeError.
template <class... Args>
std::tuple<Args...> decode_args(const Payload& p) {
  detail::Parsed parsed(p.bytes);
  const msgpack::object& o = parsed.get();
  if (o.type != msgpack::type::ARRAY || o.via.array.size != sizeof...(Args)) {
    throw DecodeError("expected " + std::to_string(sizeof...(Args)) + " argument(s)");
  }
  std::tuple<Args...> out;
  detail::CodecScope scope(const_cast<std::vector<TensorView>*>(&p.tensors));
  detail::convert_elements(o, out, std::index_sequence_for<Args...>{});
  return out;
}

// decode_args for a std::tuple type.
template <class Tuple>
struct TupleDecoder;
template <class... A>
struct TupleDecoder<std::tuple<A...>> {
  static std::tuple<A...> decode(const Payload& p) { return decode_args<A...>(p); }
};

// Decodes one value. Throws DecodeError.
template <class T>
T decode_value(const Payload& p) {
  detail::Parsed parsed(p.bytes);
  T out{};
  detail::CodecScope scope(const_cast<std::vector<TensorView>*>(&p.tensors));
  detail::convert_checked(parsed.get(), out);
  return out;
}

}  // namespace troupe

// --- msgpack adaptor: TensorView as a slot in the current Payload's tensor table -------------------
namespace msgpack {
MSGPACK_API_VERSION_NAMESPACE(MSGPACK_DEFAULT_API_NS) {
namespace adaptor {

template <>
struct pack<troupe::TensorView> {
  template <class Stream>
  packer<Stream>& operator()(packer<Stream>& o, const troupe::TensorView& t) const {
    auto* table = troupe::detail::codec_tensors();
    if (table == nullptr) throw std::logic_error("TensorView packed outside troupe::encode_*");
    auto slot = static_cast<std::uint32_t>(table->size());
    table->push_back(t);
    char b[4];
    for (int i = 0; i < 4; ++i) b[i] = static_cast<char>((slot >> (8 * i)) & 0xff);
    o.pack_ext(4, troupe::detail::kTensorExt);
    o.pack_ext_body(b, 4);
    return o;
  }
};

template <>
struct convert<troupe::TensorView> {
  const msgpack::object& operator()(const msgpack::object& o, troupe::TensorView& t) const {
    if (o.type != msgpack::type::EXT || o.via.ext.type() != troupe::detail::kTensorExt ||
        o.via.ext.size != 4) {
      throw troupe::DecodeError("expected a tensor");
    }
    std::uint32_t slot = 0;
    for (int i = 0; i < 4; ++i) slot |= std::uint32_t(std::uint8_t(o.via.ext.data()[i])) << (8 * i);
    auto* table = troupe::detail::codec_tensors();
    if (table == nullptr || slot >= table->size()) throw troupe::DecodeError("tensor slot out of range");
    t = (*table)[slot];
    return o;
  }
};

// --- msgpack adaptor: Error as [domain, code, message]; a vector of Results (call_all's slots) ------
template <>
struct pack<troupe::Error> {
  template <class Stream>
  packer<Stream>& operator()(packer<Stream>& o, const troupe::Error& e) const {
    o.pack_array(3);
    o.pack(static_cast<std::uint8_t>(e.code.domain()));
    o.pack(e.code.value());
    o.pack(e.message);
    return o;
  }
};

template <>
struct convert<troupe::Error> {
  const msgpack::object& operator()(const msgpack::object& o, troupe::Error& e) const {
    if (o.type != msgpack::type::ARRAY || o.via.array.size != 3) throw troupe::DecodeError("expected an error");
    e.code = troupe::Code::from_wire(o.via.array.ptr[0].as<std::uint8_t>(), o.via.array.ptr[1].as<std::uint16_t>());
    e.message = o.via.array.ptr[2].as<std::string>();
    return o;
  }
};

// A Result as [true, value] (void: [true]) or [false, error].
template <class T>
struct pack<troupe::Result<T>> {
  template <class Stream>
  packer<Stream>& operator()(packer<Stream>& o, const troupe::Result<T>& r) const {
    if (!r.ok()) {
      o.pack_array(2);
      o.pack(false);
      o.pack(r.error());
      return o;
    }
    if constexpr (std::is_void_v<T>) {
      o.pack_array(1);
      o.pack(true);
    } else {
      o.pack_array(2);
      o.pack(true);
      o.pack(r.value());
    }
    return o;
  }
};

// Results have no empty state, so a vector of them is built element by element.
template <class T>
struct convert<std::vector<troupe::Result<T>>> {
  const msgpack::object& operator()(const msgpack::object& o, std::vector<troupe::Result<T>>& out) const {
    if (o.type != msgpack::type::ARRAY) throw troupe::DecodeError("expected an array of results");
    out.clear();
    out.reserve(o.via.array.size);
    for (std::uint32_t i = 0; i < o.via.array.size; ++i) {
      const msgpack::object& x = o.via.array.ptr[i];
      if (x.type != msgpack::type::ARRAY || x.via.array.size < 1 || x.via.array.size > 2) throw troupe::DecodeError("expected a result");
      const bool ok = x.via.array.ptr[0].as<bool>();
      if (!ok) {
        if (x.via.array.size != 2) throw troupe::DecodeError("expected a result's error");
        out.emplace_back(x.via.array.ptr[1].as<troupe::Error>());
      } else if constexpr (std::is_void_v<T>) {
        out.emplace_back();
      } else {
        if (x.via.array.size != 2) throw troupe::DecodeError("expected a result's value");
        T value{};
        x.via.array.ptr[1].convert(value);
        out.emplace_back(std::move(value));
      }
    }
    return o;
  }
};

}  // namespace adaptor
}  // MSGPACK_API_VERSION_NAMESPACE
}  // namespace msgpack
