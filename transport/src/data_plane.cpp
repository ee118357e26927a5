#include "troupe/transport/data_plane.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <new>
#include <optional>

#include "buffer_pool.hpp"
#include "ucx_engine.hpp"

namespace troupe::transport {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kCancelGrace = std::chrono::seconds(5);   // for a copy under way to stop

[[noreturn]] void bad(const std::string& why) {
  throw ErrorException(Error{TransportCode::BadDescriptor, why});
}

std::uint64_t view_nbytes(const TensorView& t) {
  if (!t.strides.empty() && t.strides.size() != t.shape.size()) bad("tensor view: strides do not match shape");
  return checked_nbytes(t.dtype, t.shape);
}

// Copies the elements of `t` (any strides) into `dst` in row-major order.
void gather(const TensorView& t, char* dst) {
  const std::size_t es = dtype_size(t.dtype);
  if (t.is_contiguous()) return (void)std::memcpy(dst, t.data, t.nbytes());
  if (t.numel() == 0) return;
  const std::size_t nd = t.shape.size();
  const std::int64_t inner = t.shape.back();
  const std::int64_t inner_step = t.strides.back() * std::int64_t(es);
  std::vector<std::int64_t> idx(nd, 0);
  const char* base = static_cast<const char*>(t.data);
  for (;;) {
    std::int64_t off = 0;
    for (std::size_t d = 0; d + 1 < nd; ++d) off += idx[d] * t.strides[d];
    const char* src = base + off * std::int64_t(es);
    if (inner_step == std::int64_t(es)) {
      std::memcpy(dst, src, std::size_t(inner) * es);
      dst += std::size_t(inner) * es;
    } else {
      for (std::int64_t i = 0; i < inner; ++i, dst += es) std::memcpy(dst, src + i * inner_step, es);
    }
    std::size_t d = nd - 1;
    while (d > 0 && ++idx[d - 1] == t.shape[d - 1]) idx[--d] = 0;
    if (d == 0) return;
  }
}

}  // namespace

TensorDescriptor inline_descriptor(const TensorView& t) {
  const std::uint64_t n = view_nbytes(t);
  if (n > 0 && t.data == nullptr) bad("tensor view without data");
  TensorDescriptor d;
  d.dtype = t.dtype;
  d.shape = t.shape;
  d.nbytes = n;
  d.is_inline = true;
  d.inline_bytes.resize(n);
  if (n > 0) gather(t, d.inline_bytes.data());
  return d;
}

// One exposed region (DP-1): a view inside an allocate() buffer, kept alive by `keep`.
struct DataPlane::Region {
  std::shared_ptr<void> keep;
  std::size_t bytes = 0;
  Clock::time_point expires;
};

// The live allocate() buffers, so expose() can find the one a view lies in. Shared with the
// buffers' deleters: a buffer may outlive its DataPlane (the UCP context lives on with it).
struct DataPlane::Allocations {
  struct Entry { std::size_t len; std::vector<char> rkey; };
  std::shared_ptr<UcxContext> ctx;
  std::mutex mu;
  std::map<std::uintptr_t, Entry> by_start;

  std::optional<std::vector<char>> rkey_for(const void* p, std::size_t n) {
    auto a = reinterpret_cast<std::uintptr_t>(p);
    std::lock_guard lock(mu);
    auto it = by_start.upper_bound(a);
    if (it == by_start.begin()) return std::nullopt;
    --it;
    if (a + n < a || a + n > it->first + it->second.len) return std::nullopt;
    return it->second.rkey;
  }
};

DataPlane& DataPlane::instance() {
  static DataPlane plane;   // a throwing constructor leaves it unset: the next call retries
  return plane;
}

DataPlane::DataPlane()
    : ctx_(std::make_shared<UcxContext>()),
      allocations_(std::make_shared<Allocations>()),
      pool_(std::make_shared<BufferPool>()) {
  allocations_->ctx = ctx_;
  engine_ = std::make_unique<UcxEngine>(ctx_, [this] { sweep_expired(); });
}

DataPlane::~DataPlane() {
  engine_.reset();   // no tick, no get after this
  std::map<RegionId, std::shared_ptr<Region>> regions;
  {
    std::lock_guard lock(mu_);
    regions.swap(regions_);
  }
}

const std::vector<char>& DataPlane::worker_address() const { return engine_->address(); }

TensorView DataPlane::allocate(DType dtype, std::vector<std::int64_t> shape) {
  const std::size_t n = checked_nbytes(dtype, shape);
  const std::size_t len = std::max<std::size_t>((n + 63) / 64 * 64, 64);
  void* start = nullptr;
  ucp_mem_h memh = ctx_->map(nullptr, len, &start);
  std::vector<char> rkey;
  try {
    if (reinterpret_cast<std::uintptr_t>(start) % 64 != 0) bad("UCP returned unaligned memory");
    rkey = ctx_->pack_rkey(memh);
  } catch (...) {
    ctx_->unmap(memh);
    throw;
  }
  auto key = reinterpret_cast<std::uintptr_t>(start);
  {
    std::lock_guard lock(allocations_->mu);
    allocations_->by_start[key] = {len, std::move(rkey)};
  }
  ::madvise(start, len, MADV_POPULATE_WRITE);   // one batched fault pass; advice only
  std::shared_ptr<void> owner(start, [allocs = allocations_, memh, key](void*) {
    {
      std::lock_guard lock(allocs->mu);
      allocs->by_start.erase(key);
    }
    allocs->ctx->unmap(memh);
  });
  return TensorView::wrap(start, dtype, std::move(shape), std::move(owner));
}

TensorDescriptor DataPlane::expose(const TensorView& t, const ExposeOptions& opts) {
  const std::uint64_t n = view_nbytes(t);
  if (n > 0 && t.data == nullptr) bad("tensor view without data");
  if (n <= kInlineMaxBytes) return inline_descriptor(t);
  auto region = allocations_->rkey_for(t.data, n);
  if (opts.snapshot || !region || !t.is_contiguous() || !t.keep_alive) {
    TensorView copy = allocate(t.dtype, t.shape);
    gather(t, static_cast<char*>(copy.data));
    return expose(copy, {opts.lease, false});
  }
  auto r = std::make_shared<Region>();
  r->keep = t.keep_alive;
  r->bytes = n;
  r->expires = Clock::now() + opts.lease;
  sweep_expired();
  return remote_descriptor(t, *region, add_region(std::move(r)));
}

TensorDescriptor DataPlane::remote_descriptor(const TensorView& t, const std::vector<char>& rkey, RegionId id) {
  TensorDescriptor d;
  d.dtype = t.dtype;
  d.shape = t.shape;
  d.nbytes = t.nbytes();
  d.region = id;
  d.owner_pid = static_cast<std::uint32_t>(::getpid());
  d.worker_address = engine_->address();
  d.remote_address = reinterpret_cast<std::uint64_t>(t.data);
  d.rkey = rkey;
  return d;
}

RegionId DataPlane::add_region(std::shared_ptr<Region> r) {
  std::lock_guard lock(mu_);
  RegionId id = next_id_++;
  regions_[id] = std::move(r);
  return id;
}

void DataPlane::release(RegionId region) {
  std::shared_ptr<Region> r;   // destroyed (unmapped) outside the lock
  std::lock_guard lock(mu_);
  if (auto it = regions_.find(region); it != regions_.end()) {
    r = std::move(it->second);
    regions_.erase(it);
  }
}

void DataPlane::sweep_expired() {
  std::vector<std::shared_ptr<Region>> expired;
  {
    std::lock_guard lock(mu_);
    auto now = Clock::now();
    for (auto it = regions_.begin(); it != regions_.end();) {
      if (it->second->expires > now) { ++it; continue; }
      expired.push_back(std::move(it->second));
      it = regions_.erase(it);
    }
  }
  pool_->trim();
}

DataPlaneStats DataPlane::stats() const {
  DataPlaneStats s;
  {
    std::lock_guard lock(mu_);
    s.regions = regions_.size();
    for (auto& [id, r] : regions_) s.region_bytes += r->bytes;
  }
  s.cached_receive_bytes = pool_->cached_bytes();
  std::lock_guard lock(allocations_->mu);
  s.allocations = allocations_->by_start.size();
  return s;
}

TensorView DataPlane::fetch(const TensorDescriptor& d, std::chrono::milliseconds timeout) {
  if (checked_nbytes(d.dtype, d.shape) != d.nbytes) bad("descriptor: nbytes does not match shape");
  auto buf = pool_->get(d.nbytes);
  TensorView t = TensorView::wrap(buf.get(), d.dtype, d.shape, buf);
  fetch_into(d, t, timeout);
  return t;
}

void DataPlane::fetch_into(const TensorDescriptor& d, const TensorView& dst, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  if (checked_nbytes(d.dtype, d.shape) != d.nbytes) bad("descriptor: nbytes does not match shape");
  if (!dst.is_contiguous() || view_nbytes(dst) != d.nbytes) bad("fetch_into: destination is not contiguous or has the wrong size");
  if (d.is_inline) {
    if (d.inline_bytes.size() != d.nbytes) bad("descriptor: bad inline length");
    if (d.nbytes > 0) std::memcpy(dst.data, d.inline_bytes.data(), d.nbytes);
    return;
  }
  if (d.nbytes == 0) return;
  auto op = std::make_shared<GetOp>();
  op->peer.assign(d.worker_address.begin(), d.worker_address.end());
  op->remote_address = d.remote_address;
  op->rkey = d.rkey;
  op->local = dst.data;
  op->length = d.nbytes;
  op->keep = dst.keep_alive;
  engine_->submit(op);
  bool timed_out = !op->wait_until(deadline);
  if (timed_out) {
    engine_->cancel(op);
    if (!op->wait_until(Clock::now() + kCancelGrace) || op->status() != UCS_OK) {
      throw ErrorException(Error{TransportCode::Timeout, "fetch of " + std::to_string(d.nbytes) + " bytes from pid " +
                               std::to_string(d.owner_pid) + " timed out"});
    }
    return;   // finished just as the deadline passed
  }
  if (op->status() == UCS_OK) return;
  Code code = op->status() == UCS_ERR_CANCELED ? Code(TransportCode::Ucx) : Code(TransportCode::PeerGone);
  throw ErrorException(Error{code, "fetch from pid " + std::to_string(d.owner_pid) + ": " + op->error()});
}

TensorView DataPlane::map(const TensorDescriptor& d, std::chrono::milliseconds timeout) {
  if (checked_nbytes(d.dtype, d.shape) != d.nbytes) bad("descriptor: nbytes does not match shape");
  if (d.is_inline || d.nbytes == 0) return {};
  auto op = std::make_shared<GetOp>();
  op->peer.assign(d.worker_address.begin(), d.worker_address.end());
  op->remote_address = d.remote_address;
  op->rkey = d.rkey;
  op->length = d.nbytes;
  op->map_only = true;
  engine_->submit(op);
  if (!op->wait_until(Clock::now() + timeout)) {   // a map does no I/O: only a stuck engine is slow
    throw ErrorException(Error{TransportCode::Timeout, "mapping memory of pid " + std::to_string(d.owner_pid) + " timed out"});
  }
  if (op->status() == UCS_ERR_UNSUPPORTED) return {};
  if (op->status() != UCS_OK) {
    throw ErrorException(Error{TransportCode::PeerGone, "mapping memory of pid " + std::to_string(d.owner_pid) + ": " + op->error()});
  }
  return TensorView::wrap(const_cast<void*>(op->mapped), DType::U8, {std::int64_t(d.nbytes)}, op->pin);
}

}  // namespace troupe::transport
