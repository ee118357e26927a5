#include "set_builder.hpp"

#include <cstring>
#include <limits>
#include <optional>
#include <set>
#include <stdexcept>

#include "troupe/kernels/bucket.hpp"

namespace troupe::detail::weights {
namespace {

namespace k = troupe::kernels;

TensorView shaped(const WeightEntry& e, void* data, std::shared_ptr<void> keep) {
  return TensorView::wrap(data, static_cast<DType>(e.dtype), e.shape, std::move(keep));
}

// Its bytes; a shape whose size does not fit in 63 bits is refused (a peer's manifest is input:
// [2^62, 4] f32 wrapped to 0 bytes, and a view of that shape was built over a few bytes).
std::size_t entry_bytes(const WeightEntry& e) {
  std::uint64_t n = dtype_size(static_cast<DType>(e.dtype));
  for (auto d : e.shape) {
    if (d < 0) throw std::invalid_argument("weights: negative dimension in '" + e.name + "'");
    if (__builtin_mul_overflow(n, std::uint64_t(d), &n) || n > std::uint64_t(std::numeric_limits<std::int64_t>::max()))
      throw std::invalid_argument("weights: '" + e.name + "' is too large");
  }
  return std::size_t(n);
}

k::BucketLayout wire_layout(const std::vector<WeightEntry>& entries, WireCompression c) {
  std::vector<k::TensorSpec> specs;
  specs.reserve(entries.size());
  for (const auto& e : entries) {
    auto dt = static_cast<DType>(e.dtype);
    if (dt != DType::F32 && dt != DType::BF16) {
      throw std::invalid_argument("weights: compression needs f32 or bf16 tensors ('" + e.name + "' is " +
                                  std::string(dtype_name(dt)) + ")");
    }
    k::TensorSpec s;
    s.name = e.name;
    std::int64_t numel = std::int64_t(entry_bytes(e) / dtype_size(dt));
    s.rows = e.shape.size() >= 2 ? e.shape[0] : 1;
    s.cols = s.rows == 0 ? 0 : numel / s.rows;
    s.dtype = dt == DType::F32 ? k::DType::kF32 : k::DType::kBF16;
    s.wire = c == WireCompression::BF16 ? k::WireFormat::kBF16 : k::WireFormat::kInt8Row;
    specs.push_back(std::move(s));
  }
  k::BucketLayout layout;
  if (!k::plan_bucket(specs, &layout).ok()) throw std::invalid_argument("weights: cannot lay out the bucket");
  return layout;
}

std::vector<NamedTensor> views_of(const std::vector<WeightEntry>& entries, const TensorView& image) {
  std::size_t total = 0;
  auto offs = SetBuilder::offsets(entries, &total);
  std::vector<NamedTensor> out;
  out.reserve(entries.size());
  for (std::size_t i = 0; i < entries.size(); ++i) {
    out.push_back({entries[i].name, shaped(entries[i], static_cast<char*>(image.data) + offs[i], image.keep_alive)});
  }
  return out;
}

}  // namespace

std::vector<std::size_t> SetBuilder::offsets(const std::vector<WeightEntry>& entries, std::size_t* total) {
  std::vector<std::size_t> out;
  out.reserve(entries.size());
  std::size_t at = 0;
  constexpr auto kMax = std::size_t(std::numeric_limits<std::int64_t>::max());
  for (const auto& e : entries) {
    out.push_back(at);
    const std::size_t bytes = entry_bytes(e);   // < 2^63: the rounding below cannot wrap
    const std::size_t padded = (bytes + kAlign - 1) / kAlign * kAlign;
    if (padded > kMax - at) throw std::invalid_argument("weights: the set is too large");
    at += padded;
  }
  *total = std::max<std::size_t>(at, kAlign);
  return out;
}

std::size_t SetBuilder::wire_bytes(const std::vector<WeightEntry>& entries, WireCompression c) {
  std::size_t total = 0;
  if (c == WireCompression::None) return (void)offsets(entries, &total), total;
  return std::max<std::size_t>(wire_layout(entries, c).bytes, kAlign);
}

std::vector<WeightEntry> SetBuilder::entries_of(const std::vector<NamedTensor>& tensors) {
  std::vector<WeightEntry> out;
  std::set<std::string> seen;
  for (const auto& t : tensors) {
    if (t.name.empty() || !seen.insert(t.name).second) {
      throw std::invalid_argument("weights: empty or repeated tensor name '" + t.name + "'");
    }
    out.push_back({t.name, static_cast<std::uint8_t>(t.tensor.dtype), t.tensor.shape});
  }
  return out;
}

std::vector<WeightEntry> SetBuilder::entries_of(const WeightSet& s) { return entries_of(s.tensors()); }

WeightSetPtr SetBuilder::build(std::uint64_t version, const std::vector<WeightEntry>& entries, WireCompression c,
                               BufferPool& pool, const std::function<void(std::size_t, void*)>& write, int device) {
  std::size_t total = 0;
  auto offs = offsets(entries, &total);
  TensorView image = pool.get(total);
  auto* base = static_cast<char*>(image.data);
  std::size_t end = 0;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    std::memset(base + end, 0, offs[i] - end);   // padding is zero: equal weights, equal checksum
    write(i, base + offs[i]);
    end = offs[i] + entry_bytes(entries[i]);
  }
  std::memset(base + end, 0, total - end);
  auto set = std::make_shared<WeightSet>();
  set->version_ = version;
  set->compression_ = c;
  set->tensors_ = views_of(entries, image);
  set->bytes_ = total;
  set->image_ = image;
  if (c == WireCompression::None) {
    set->wire_ = image;
  } else {
    auto layout = wire_layout(entries, c);
    set->wire_ = pool.get(std::max<std::size_t>(layout.bytes, kAlign));
    std::vector<const void*> srcs;
    for (const auto& t : set->tensors_) srcs.push_back(t.tensor.data);
    std::memset(set->wire_.data, 0, set->wire_.nbytes());
    if (!k::pack_bucket(layout, srcs, static_cast<std::byte*>(set->wire_.data)).ok()) {
      throw std::invalid_argument("weights: packing the wire image failed");
    }
  }
  set->checksum_ = weight_checksum(set->wire_.data, set->wire_.nbytes());
  if (device >= 0) {
    std::string error;
    auto img = std::make_shared<DeviceImage>();
    img->buffer = gpu::DeviceBuffer::allocate(total, device, &error);
    std::optional<gpu::IpcHandle> handle;
    auto uuid = gpu::device_uuid(device, &error);
    if (uuid && img->buffer && img->buffer->upload(image.data, total, &error)) {
      handle = gpu::export_buffer(img->buffer->data(), total, device, &error);
    }
    if (!handle) throw std::runtime_error("weights: mirroring version " + std::to_string(version) + " on device " +
                                          std::to_string(device) + ": " + error);
    img->handle = *handle;
    img->uuid = *uuid;
    img->checksum = c == WireCompression::None ? set->checksum_ : weight_checksum(image.data, total);
    set->device_image_ = std::move(img);
  }
  return set;
}

std::shared_ptr<WeightSet> SetBuilder::received(std::uint64_t version, std::uint64_t checksum,
                                                const std::vector<WeightEntry>& entries, WireCompression c) {
  auto set = std::make_shared<WeightSet>();
  set->version_ = version;
  set->checksum_ = checksum;
  set->compression_ = c;
  (void)offsets(entries, &set->bytes_);
  return set;
}

WeightSetPtr SetBuilder::on_device(std::uint64_t version, std::uint64_t checksum, const std::vector<WeightEntry>& entries,
                                   WireCompression c, void* data, int device, std::shared_ptr<void> keep) {
  auto set = received(version, checksum, entries, c);
  set->image_ = TensorView::wrap(data, DType::U8, {std::int64_t(set->bytes_)}, std::move(keep));
  set->tensors_ = views_of(entries, set->image_);
  set->wire_ = TensorView::wrap(nullptr, DType::U8, {0}, nullptr);   // nothing to serve from here
  set->device_ = device;
  return set;
}

WeightSetPtr SetBuilder::to_device(const WeightSetPtr& host, int device) {
  if (host->device_ == device) return host;
  auto entries = entries_of(*host);
  if (const auto* img = host->device_image_.get(); img && img->handle.device == device) {
    return on_device(host->version_, host->checksum_, entries, host->compression_, img->buffer->data(), device,
                     std::shared_ptr<void>(host, img->buffer->data()));
  }
  std::string error;
  std::shared_ptr<gpu::DeviceBuffer> buf = gpu::DeviceBuffer::allocate(host->bytes_, device, &error);
  if (!buf || !buf->upload(host->image_.data, host->bytes_, &error)) {
    throw ErrorException(Error{WeightCode::Transfer, "uploading version " + std::to_string(host->version_) +
                                                       " to device " + std::to_string(device) + ": " + error});
  }
  void* data = buf->data();
  return on_device(host->version_, host->checksum_, entries, host->compression_, data, device, std::move(buf));
}

void SetBuilder::check_device(int device, const char* who) {
  if (device < 0) return;
  std::string error;
  if (!gpu::compiled()) throw std::invalid_argument(std::string(who) + ": device " + std::to_string(device) + ": built without CUDA");
  int n = gpu::device_count(&error);
  if (device >= n) {
    throw std::invalid_argument(std::string(who) + ": no CUDA device " + std::to_string(device) + " (" +
                                std::to_string(n) + " found" + (error.empty() ? "" : ": " + error) + ")");
  }
}

WeightSetPtr SetBuilder::from_wire(std::uint64_t version, std::uint64_t checksum,
                                   const std::vector<WeightEntry>& entries, WireCompression c, TensorView wire,
                                   BufferPool& pool) {
  auto set = received(version, checksum, entries, c);
  const std::size_t total = set->bytes_;
  if (c == WireCompression::None) {
    set->tensors_ = views_of(entries, wire);
    set->image_ = wire;
  } else {
    auto layout = wire_layout(entries, c);
    TensorView image = pool.get(total);
    set->tensors_ = views_of(entries, image);
    set->image_ = image;
    std::vector<void*> dsts;
    for (const auto& t : set->tensors_) dsts.push_back(t.tensor.data);
    if (!k::unpack_bucket(layout, static_cast<const std::byte*>(wire.data), dsts).ok()) {
      throw ErrorException(Error{WeightCode::Transfer, "decoding the wire image failed"});
    }
  }
  set->wire_ = std::move(wire);
  return set;
}

}  // namespace troupe::detail::weights
