// NcclBroadcaster (gpu_sync.hpp): NCCL broadcast of a device buffer within a group, one rank per
// GPU. Compiled with the real calls when the build defines TROUPE_WEIGHTS_NCCL (NCCL found).
#include "weights/gpu_sync.hpp"

#ifdef TROUPE_WEIGHTS_NCCL
#include <nccl.h>

#include "weights/cuda_status.hpp"
#endif

#include <algorithm>
#include <cstring>

namespace troupe::detail::weights::gpu {

#ifdef TROUPE_WEIGHTS_NCCL
namespace {

bool ok(cudaError_t e, std::string* error) { return cuda_ok(e, error); }
bool ok(ncclResult_t r, std::string* error) {
  if (r == ncclSuccess) return true;
  if (error) *error = std::string("nccl: ") + ncclGetErrorString(r);
  return false;
}

}  // namespace

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

#else   // built without NCCL

namespace {
bool absent(std::string* error) {
  if (error) *error = "built without NCCL";
  return false;
}
}  // namespace

std::optional<std::array<char, 128>> NcclBroadcaster::make_id(std::string* error) { return absent(error), std::nullopt; }
std::unique_ptr<NcclBroadcaster> NcclBroadcaster::create(const std::array<char, 128>&, int, int, int, std::string* error) {
  return absent(error), nullptr;
}
NcclBroadcaster::~NcclBroadcaster() = default;
bool NcclBroadcaster::broadcast(void*, std::size_t, int, std::size_t, std::string* error) { return absent(error); }

#endif

}  // namespace troupe::detail::weights::gpu
