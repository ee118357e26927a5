#include "gpu_sync.hpp"

// The CUDA runtime half of the GPU paths (IPC, device buffers), compiled with the real calls when
// the build defines TROUPE_WEIGHTS_GPU (CUDA found). NcclBroadcaster is in nccl_broadcast.cpp, so
// that programs which do not broadcast do not load NCCL.
#ifdef TROUPE_WEIGHTS_GPU
#include "cuda_status.hpp"
#endif

#include <algorithm>
#include <chrono>
#include <cstring>

namespace troupe::detail::weights::gpu {

#ifdef TROUPE_WEIGHTS_GPU
namespace {

bool ok(cudaError_t e, std::string* error) { return cuda_ok(e, error); }

// A copy that has landed when this returns: cudaMemcpy alone returns early for device-to-device
// and pageable host-to-device copies. On a stream of its own that does not wait for (or hold up)
// the work of the process's other streams.
bool copy_sync(void* dst, const void* src, std::size_t n, cudaMemcpyKind kind, int device, std::string* error) {
  OnDevice on(device, error);
  cudaStream_t s;
  if (!on || !ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), error)) return false;
  bool good = ok(cudaMemcpyAsync(dst, src, n, kind, s), error);
  good = ok(cudaStreamSynchronize(s), good ? error : nullptr) && good;
  (void)cudaStreamDestroy(s);
  return good;
}

}  // namespace

bool compiled() { return true; }

int device_count(std::string* error) {
  int n = 0;
  return ok(cudaGetDeviceCount(&n), error) ? n : 0;
}

std::optional<std::array<char, 16>> device_uuid(int device, std::string* error) {
  cudaDeviceProp prop;
  if (!ok(cudaGetDeviceProperties(&prop, device), error)) return std::nullopt;
  std::array<char, 16> out{};
  static_assert(sizeof(prop.uuid.bytes) == sizeof(out));
  std::memcpy(out.data(), prop.uuid.bytes, out.size());
  return out;
}

std::optional<IpcHandle> export_buffer(void* device_ptr, std::size_t nbytes, int device, std::string* error) {
  OnDevice on(device, error);
  if (!on) return std::nullopt;
  cudaIpcMemHandle_t h;
  if (!ok(cudaIpcGetMemHandle(&h, device_ptr), error)) return std::nullopt;
  IpcHandle out;
  static_assert(sizeof(h) == sizeof(out.bytes));
  std::memcpy(out.bytes.data(), &h, sizeof h);
  out.nbytes = nbytes;
  out.device = device;
  return out;
}

std::unique_ptr<IpcMapping> IpcMapping::open(const IpcHandle& h, std::string* error) {
  OnDevice on(h.device, error);
  if (!on) return nullptr;
  cudaIpcMemHandle_t mh;
  std::memcpy(&mh, h.bytes.data(), sizeof mh);
  void* p = nullptr;
  if (!ok(cudaIpcOpenMemHandle(&p, mh, cudaIpcMemLazyEnablePeerAccess), error)) return nullptr;
  return std::unique_ptr<IpcMapping>(new IpcMapping(p, h.nbytes, h.device));
}

IpcMapping::~IpcMapping() {
  OnDevice on(device_, nullptr);
  (void)cudaIpcCloseMemHandle(ptr_);
}

bool IpcMapping::copy_to(void* dst, std::string* error) const {
  return copy_sync(dst, ptr_, n_, cudaMemcpyDeviceToDevice, device_, error);
}

std::unique_ptr<DeviceBuffer> DeviceBuffer::allocate(std::size_t nbytes, int device, std::string* error) {
  void* p = nullptr;
  OnDevice on(device, error);
  if (!on || !ok(cudaMalloc(&p, std::max<std::size_t>(nbytes, 1)), error)) return nullptr;
  return std::unique_ptr<DeviceBuffer>(new DeviceBuffer(p, nbytes, device));
}

DeviceBuffer::~DeviceBuffer() {
  OnDevice on(device_, nullptr);
  if (on) (void)cudaFree(ptr_);
}

bool DeviceBuffer::upload(const void* host, std::size_t n, std::string* error) {
  return copy_sync(ptr_, host, std::min(n, n_), cudaMemcpyHostToDevice, device_, error);
}

bool copy_to_host(const void* device_src, std::size_t n, void* host, int device, std::string* error) {
  return copy_sync(host, device_src, n, cudaMemcpyDeviceToHost, device, error);
}

bool DeviceBuffer::copy_from(const void* device_src, std::size_t n, std::string* error) {
  return copy_sync(ptr_, device_src, std::min(n, n_), cudaMemcpyDeviceToDevice, device_, error);
}

double copy_gbps(std::size_t nbytes, int device, std::string* error) {
  auto a = DeviceBuffer::allocate(nbytes, device, error);
  auto b = a ? DeviceBuffer::allocate(nbytes, device, error) : nullptr;
  if (!b || !b->copy_from(a->data(), nbytes, error)) return 0;   // warm-up
  double best = 1e9;
  for (int i = 0; i < 3; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    if (!b->copy_from(a->data(), nbytes, error)) return 0;
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return double(nbytes) / best / 1e9;
}

#else   // CPU-only build: the GPU paths report that they are absent.

namespace {
bool absent(std::string* error) {
  if (error) *error = "built without CUDA";
  return false;
}
}  // namespace

bool compiled() { return false; }
int device_count(std::string* error) { return absent(error), 0; }
std::optional<std::array<char, 16>> device_uuid(int, std::string* error) { return absent(error), std::nullopt; }
std::optional<IpcHandle> export_buffer(void*, std::size_t, int, std::string* error) { return absent(error), std::nullopt; }
std::unique_ptr<IpcMapping> IpcMapping::open(const IpcHandle&, std::string* error) { return absent(error), nullptr; }
IpcMapping::~IpcMapping() = default;
bool IpcMapping::copy_to(void*, std::string* error) const { return absent(error); }
std::unique_ptr<DeviceBuffer> DeviceBuffer::allocate(std::size_t, int, std::string* error) { return absent(error), nullptr; }
DeviceBuffer::~DeviceBuffer() = default;
bool DeviceBuffer::upload(const void*, std::size_t, std::string* error) { return absent(error); }
bool DeviceBuffer::copy_from(const void*, std::size_t, std::string* error) { return absent(error); }
double copy_gbps(std::size_t, int, std::string* error) { return absent(error), 0; }
bool copy_to_host(const void*, std::size_t, void*, int, std::string* error) { return absent(error); }

#endif

}  // namespace troupe::detail::weights::gpu
