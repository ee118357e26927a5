#include "weights/gpu_sync.hpp"

#if __has_include(<nccl.h>) && __has_include(<cuda_runtime_api.h>)
#define TROUPE_WEIGHTS_GPU 1
#include <cuda_runtime_api.h>
#include <nccl.h>
#endif

#include <cstring>

namespace troupe::detail::weights::gpu {

#ifdef TROUPE_WEIGHTS_GPU
namespace {

bool ok(cudaError_t e, std::string* error) {
  if (e == cudaSuccess) return true;
  if (error) *error = std::string("cuda: ") + cudaGetErrorString(e);
  return false;
}
bool ok(ncclResult_t r, std::string* error) {
  if (r == ncclSuccess) return true;
  if (error) *error = std::string("nccl: ") + ncclGetErrorString(r);
  return false;
}

}  // namespace

bool compiled() { return true; }

int device_count(std::string* error) {
  int n = 0;
  return ok(cudaGetDeviceCount(&n), error) ? n : 0;
}

std::optional<IpcHandle> export_buffer(void* device_ptr, std::size_t nbytes, int device, std::string* error) {
  if (!ok(cudaSetDevice(device), error)) return std::nullopt;
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
  if (!ok(cudaSetDevice(h.device), error)) return nullptr;
  cudaIpcMemHandle_t mh;
  std::memcpy(&mh, h.bytes.data(), sizeof mh);
  void* p = nullptr;
  if (!ok(cudaIpcOpenMemHandle(&p, mh, cudaIpcMemLazyEnablePeerAccess), error)) return nullptr;
  return std::unique_ptr<IpcMapping>(new IpcMapping(p, h.nbytes));
}

IpcMapping::~IpcMapping() { (void)cudaIpcCloseMemHandle(ptr_); }

bool IpcMapping::copy_to(void* dst, std::string* error) const {
  return ok(cudaMemcpy(dst, ptr_, n_, cudaMemcpyDeviceToDevice), error);
}

std::optional<std::array<char, 128>> NcclBroadcaster::make_id(std::string* error) {
  ncclUniqueId id;
  if (!ok(ncclGetUniqueId(&id), error)) return std::nullopt;
  std::array<char, 128> out{};
  static_assert(sizeof(id) == sizeof(out));
  std::memcpy(out.data(), &id, sizeof id);
  return out;
}

std::unique_ptr<NcclBroadcaster> NcclBroadcaster::create(const std::array<char, 128>& id, int rank, int nranks,
                                                         int device, std::string* error) {
  if (!ok(cudaSetDevice(device), error)) return nullptr;
  std::unique_ptr<NcclBroadcaster> b(new NcclBroadcaster);
  cudaStream_t s;
  if (!ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), error)) return nullptr;
  b->stream_ = s;
  ncclUniqueId uid;
  std::memcpy(&uid, id.data(), sizeof uid);
  ncclComm_t comm;
  if (!ok(ncclCommInitRank(&comm, nranks, uid, rank), error)) return nullptr;
  b->comm_ = comm;
  return b;
}

NcclBroadcaster::~NcclBroadcaster() {
  if (comm_) (void)ncclCommDestroy(static_cast<ncclComm_t>(comm_));
  if (stream_) (void)cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
}

bool NcclBroadcaster::broadcast(void* buf, std::size_t nbytes, int root, std::size_t bucket, std::string* error) {
  auto comm = static_cast<ncclComm_t>(comm_);
  auto stream = static_cast<cudaStream_t>(stream_);
  if (bucket == 0) bucket = nbytes;
  if (!ok(ncclGroupStart(), error)) return false;
  for (std::size_t off = 0; off < nbytes; off += bucket) {
    std::size_t len = std::min(bucket, nbytes - off);
    char* p = static_cast<char*>(buf) + off;
    if (!ok(ncclBroadcast(p, p, len, ncclUint8, root, comm, stream), error)) return (void)ncclGroupEnd(), false;
  }
  if (!ok(ncclGroupEnd(), error)) return false;
  return ok(cudaStreamSynchronize(stream), error);
}

#else   // CPU-only build: the GPU paths report that they are absent.

namespace {
bool absent(std::string* error) {
  if (error) *error = "built without CUDA/NCCL";
  return false;
}
}  // namespace

bool compiled() { return false; }
int device_count(std::string* error) { return absent(error), 0; }
std::optional<IpcHandle> export_buffer(void*, std::size_t, int, std::string* error) { return absent(error), std::nullopt; }
std::unique_ptr<IpcMapping> IpcMapping::open(const IpcHandle&, std::string* error) { return absent(error), nullptr; }
IpcMapping::~IpcMapping() = default;
bool IpcMapping::copy_to(void*, std::string* error) const { return absent(error); }
std::optional<std::array<char, 128>> NcclBroadcaster::make_id(std::string* error) { return absent(error), std::nullopt; }
std::unique_ptr<NcclBroadcaster> NcclBroadcaster::create(const std::array<char, 128>&, int, int, int, std::string* error) {
  return absent(error), nullptr;
}
NcclBroadcaster::~NcclBroadcaster() = default;
bool NcclBroadcaster::broadcast(void*, std::size_t, int, std::size_t, std::string* error) { return absent(error); }

#endif

}  // namespace troupe::detail::weights::gpu
