#include "cluster/wire.hpp"

#include <cstring>

#include "troupe/net/link.hpp"
#include "troupe/transport/data_plane.hpp"

namespace troupe::detail {

std::size_t inline_limit(const net::Link& link) {
  return link.has_lane() ? transport::kLaneInlineMaxBytes : transport::kInlineMaxBytes;
}

WirePayload to_wire(Payload& p, std::size_t inline_max) {
  if (inline_max == 0) inline_max = transport::kInlineMaxBytes;
  WirePayload w;
  w.bytes = std::move(p.bytes);
  w.tensors.reserve(p.tensors.size());
  for (const auto& t : p.tensors) {
    if (t.nbytes() <= inline_max) {   // in the message (no UCX context for these)
      w.tensors.push_back(transport::encode_inline(t));
      continue;
    }
    auto d = transport::DataPlane::instance().expose(t);
    if (d.region != 0) w.regions.push_back(d.region);
    w.tensors.push_back(transport::encode(d));
  }
  return w;
}

Payload from_wire(std::vector<char> bytes, const std::vector<std::vector<char>>& tensors,
                  std::chrono::milliseconds timeout, std::vector<std::uint64_t>* fetched_regions) {
  Payload p;
  p.bytes = std::move(bytes);
  p.tensors.reserve(tensors.size());
  for (const auto& raw : tensors) {
    transport::DescriptorView v;
    try {
      v = transport::decode_descriptor_view(raw.data(), raw.size());
    } catch (const ErrorException& e) {
      throw DecodeError(e.error().message);
    }
    auto& d = v.descriptor;
    if (d.is_inline) {
      auto t = TensorView::uninitialized(d.dtype, d.shape);   // written whole by the copy
      if (d.nbytes > 0) std::memcpy(t.data, v.inline_data, std::size_t(d.nbytes));
      p.tensors.push_back(std::move(t));
      continue;
    }
    try {
      p.tensors.push_back(transport::DataPlane::instance().fetch(d, timeout));
      if (fetched_regions != nullptr) fetched_regions->push_back(d.region);
    } catch (const ErrorException& e) {   // the call's fate, in core terms; the transport's code in the text
      Code c = e.code();
      ErrorCode code = c == TransportCode::BadDescriptor ? ErrorCode::BadArguments
                     : c == TransportCode::Timeout       ? ErrorCode::Timeout
                     : c == TransportCode::PeerGone      ? ErrorCode::ActorDied
                                                         : ErrorCode::Unavailable;
      throw CallError(Error{code, std::string("tensor transfer: ") + e.what()});
    }
  }
  return p;
}

void release_regions(const std::vector<std::uint64_t>& regions) {
  if (regions.empty()) return;
  auto& dp = transport::DataPlane::instance();
  for (auto r : regions) dp.release(r);
}

}  // namespace troupe::detail
