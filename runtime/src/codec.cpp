#include "troupe/codec.hpp"

namespace troupe::detail {

std::vector<TensorView>*& codec_tensors() {
  thread_local std::vector<TensorView>* table = nullptr;
  return table;
}

namespace {

struct ThreadZone {
  msgpack::zone zone;
  bool busy = false;
};
ThreadZone& thread_zone() {
  thread_local ThreadZone z;
  return z;
}

[[noreturn]] void rethrow_as_decode_error() {
  try {
    throw;
  } catch (const DecodeError&) {
    throw;
  } catch (const msgpack::insufficient_bytes&) {
    throw DecodeError("truncated message");
  } catch (const msgpack::size_overflow&) {
    throw DecodeError("message exceeds size limits");
  } catch (const msgpack::unpack_error& e) {
    throw DecodeError(std::string("malformed message: ") + e.what());
  } catch (const std::bad_alloc&) {
    throw DecodeError("message too large");
  }
}

}  // namespace

Parsed::Parsed(const std::vector<char>& bytes) {
  // Bounds for bytes that may come from another process: no header can make us allocate more
  // than these element counts before the bytes backing them have been seen.
  static const msgpack::unpack_limit kLimits(/*array*/ 1u << 24, /*map*/ 1u << 20, /*str*/ 1u << 30,
                                             /*bin*/ 1u << 31, /*ext*/ 1u << 20, /*depth*/ 64);
  ThreadZone& tz = thread_zone();
  if (tz.busy) {
    own_ = std::make_unique<msgpack::zone>();
    zone_ = own_.get();
  } else {
    tz.busy = true;
    zone_ = &tz.zone;
  }
  try {
    std::size_t off = 0;
    object_ = msgpack::unpack(*zone_, bytes.data(), bytes.size(), off, nullptr, nullptr, kLimits);
    if (off != bytes.size()) throw DecodeError("trailing bytes after the message");
  } catch (...) {
    release();
    rethrow_as_decode_error();
  }
}

Parsed::~Parsed() { release(); }

void Parsed::release() {
  if (own_ == nullptr && zone_ != nullptr) {
    zone_->clear();
    thread_zone().busy = false;
  }
  zone_ = nullptr;
}

}  // namespace troupe::detail
