// NcclBroadcaster (gpu_sync.hpp): NCCL broadcast of a device buffer within a group, one rank per
// GPU. Compiled with the real calls when the build defines TROUPE_WEIGHTS_NCCL (nccl.h found);
// libnccl.so.2 itself is opened with dlopen on first use, so that the runtime does not depend on
// it (208 MB) and a program that never broadcasts never loads it.
//
// Every communicator is non-blocking (ncclConfig_t::blocking = 0): joining and each broadcast
// are polled against a deadline and aborted past it, the way a watchdog would. A rank that died,
// or never came, then costs the others one timeout instead of a hang.
#include "gpu_sync.hpp"

#ifdef TROUPE_WEIGHTS_NCCL
#include <dlfcn.h>
#include <nccl.h>

#include "cuda_status.hpp"
#endif

#include <algorithm>
#include <cstring>
#include <thread>

namespace troupe::detail::weights::gpu {

#ifdef TROUPE_WEIGHTS_NCCL
namespace {

using Clock = std::chrono::steady_clock;

// The NCCL entry points troupe uses, from the libnccl.so.2 that dlopen finds (LD_LIBRARY_PATH,
// the loader's cache). The types come from the nccl.h this was built against.
struct Nccl {
#define TROUPE_NCCL_FUNCTIONS(X)                                                                       \
  X(ncclGetUniqueId) X(ncclCommInitRankConfig) X(ncclCommGetAsyncError) X(ncclCommFinalize)            \
  X(ncclCommDestroy) X(ncclCommAbort) X(ncclGroupStart) X(ncclGroupEnd) X(ncclBroadcast)               \
  X(ncclGetErrorString) X(ncclGetLastError)
#define TROUPE_NCCL_MEMBER(f) decltype(&::f) f = nullptr;
  TROUPE_NCCL_FUNCTIONS(TROUPE_NCCL_MEMBER)
#undef TROUPE_NCCL_MEMBER
  std::string error;   // why it did not load ("" when it did)

  static const Nccl& get() {
    static const Nccl n = load();
    return n;
  }

 private:
  static Nccl load() {
    Nccl n;
    void* lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) lib = dlopen("libnccl.so", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      const char* why = dlerror();
      n.error = std::string("nccl: cannot load libnccl.so.2: ") + (why ? why : "not found");
      return n;
    }
#define TROUPE_NCCL_LOAD(f)                                                       \
  n.f = reinterpret_cast<decltype(&::f)>(dlsym(lib, #f));                         \
  if (n.f == nullptr && n.error.empty()) n.error = "nccl: libnccl.so.2 lacks " #f;
    TROUPE_NCCL_FUNCTIONS(TROUPE_NCCL_LOAD)
#undef TROUPE_NCCL_LOAD
    return n;   // the library stays loaded for the process's life
  }
#undef TROUPE_NCCL_FUNCTIONS
};

const Nccl* nccl(std::string* error) {
  const Nccl& n = Nccl::get();
  if (n.error.empty()) return &n;
  if (error) *error = n.error;
  return nullptr;
}

bool ok(ncclResult_t r, std::string* error) {
  if (r == ncclSuccess || r == ncclInProgress) return true;
  if (error) {
    const Nccl& n = Nccl::get();
    const char* last = n.ncclGetLastError ? n.ncclGetLastError(nullptr) : nullptr;
    *error = std::string("nccl: ") + n.ncclGetErrorString(r) + (last && *last ? std::string(" (") + last + ")" : "");
  }
  return false;
}

bool stopped(const std::atomic<bool>* stop) { return stop != nullptr && stop->load(std::memory_order_relaxed); }

// Polls `comm` until its pending operation (an init, an enqueue) is no longer in progress.
// False on its error, past `deadline` or on `stop`.
bool settle(ncclComm_t comm, Clock::time_point deadline, const std::atomic<bool>* stop, const char* what,
            std::string* error) {
  const Nccl& n = Nccl::get();
  for (;;) {
    ncclResult_t state = ncclSuccess;
    if (!ok(n.ncclCommGetAsyncError(comm, &state), error)) return false;
    if (state == ncclSuccess) return true;
    if (state != ncclInProgress) return ok(state, error);
    if (stopped(stop) || Clock::now() >= deadline) {
      if (error) *error = std::string("nccl: ") + what + (stopped(stop) ? " stopped" : " timed out");
      return false;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

}  // namespace

bool NcclBroadcaster::available(std::string* error) { return nccl(error) != nullptr; }

std::optional<std::array<char, 128>> NcclBroadcaster::make_id(std::string* error) {
  const Nccl* n = nccl(error);
  ncclUniqueId id;
  if (n == nullptr || !ok(n->ncclGetUniqueId(&id), error)) return std::nullopt;
  std::array<char, 128> out{};
  static_assert(sizeof(id) == sizeof(out));
  std::memcpy(out.data(), &id, sizeof id);
  return out;
}

std::unique_ptr<NcclBroadcaster> NcclBroadcaster::create(const std::array<char, 128>& id, int rank, int nranks,
                                                         int device, std::chrono::milliseconds timeout,
                                                         std::string* error, const std::atomic<bool>* stop) {
  const Nccl* n = nccl(error);
  if (n == nullptr) return nullptr;
  const auto deadline = Clock::now() + timeout;
  OnDevice on(device, error);
  if (!on) return nullptr;
  std::unique_ptr<NcclBroadcaster> b(new NcclBroadcaster);
  b->device_ = device;
  cudaStream_t s;
  if (!cuda_ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), error)) return nullptr;
  b->stream_ = s;
  ncclUniqueId uid;
  std::memcpy(&uid, id.data(), sizeof uid);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  ncclResult_t r = n->ncclCommInitRankConfig(&comm, nranks, uid, rank, &config);
  b->comm_ = comm;
  if (!ok(r, error) || comm == nullptr || !settle(comm, deadline, stop, "joining the group", error)) {
    b->abort();
    return nullptr;
  }
  return b;
}

void NcclBroadcaster::abort() {
  if (comm_ == nullptr) return;
  std::string ignored;
  OnDevice on(device_, &ignored);
  (void)Nccl::get().ncclCommAbort(static_cast<ncclComm_t>(comm_));
  comm_ = nullptr;
}

NcclBroadcaster::~NcclBroadcaster() {
  if (comm_ != nullptr) {   // healthy: flush, then free; abort if that does not settle
    std::string ignored;
    OnDevice on(device_, &ignored);
    const Nccl& n = Nccl::get();
    auto comm = static_cast<ncclComm_t>(comm_);
    if (ok(n.ncclCommFinalize(comm), &ignored) &&
        settle(comm, Clock::now() + std::chrono::seconds(5), nullptr, "finalize", &ignored)) {
      (void)n.ncclCommDestroy(comm);
      comm_ = nullptr;
    } else {
      abort();
    }
  }
  if (stream_ != nullptr) {
    std::string ignored;
    OnDevice on(device_, &ignored);
    (void)cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
  }
}

bool NcclBroadcaster::broadcast(void* buf, std::size_t nbytes, int root, std::size_t bucket,
                                std::chrono::milliseconds timeout, std::string* error, const std::atomic<bool>* stop) {
  if (comm_ == nullptr) {
    if (error) *error = "nccl: the communicator was aborted after an earlier failure";
    return false;
  }
  const auto deadline = Clock::now() + timeout;
  const Nccl& n = Nccl::get();
  auto comm = static_cast<ncclComm_t>(comm_);
  auto stream = static_cast<cudaStream_t>(stream_);
  OnDevice on(device_, error);
  if (!on) return false;
  if (bucket == 0) bucket = std::max<std::size_t>(nbytes, 1);
  bool good = ok(n.ncclGroupStart(), error);
  for (std::size_t off = 0; good && off < nbytes; off += bucket) {
    std::size_t len = std::min(bucket, nbytes - off);
    char* p = static_cast<char*>(buf) + off;
    good = ok(n.ncclBroadcast(p, p, len, ncclUint8, root, comm, stream), error);
  }
  good = ok(n.ncclGroupEnd(), good ? error : nullptr) && good;
  good = good && settle(comm, deadline, stop, "enqueueing the broadcast", error);
  while (good) {   // the stream runs the broadcast: wait for it, watching for NCCL's own errors
    cudaError_t e = cudaStreamQuery(stream);
    if (e == cudaSuccess) return true;
    if (e != cudaErrorNotReady) {
      good = cuda_ok(e, error);
      break;
    }
    ncclResult_t state = ncclSuccess;
    good = ok(n.ncclCommGetAsyncError(comm, &state), error) && ok(state, error);
    if (good && (stopped(stop) || Clock::now() >= deadline)) {
      if (error) *error = stopped(stop) ? "nccl: broadcast stopped" : "nccl: broadcast timed out (a rank did not take part)";
      good = false;
    }
    if (good) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  abort();   // a failed or abandoned collective leaves the communicator unusable
  return false;
}

#else   // built without NCCL

namespace {
bool absent(std::string* error) {
  if (error) *error = "nccl: not built (no nccl.h where CMake looked)";
  return false;
}
}  // namespace

bool NcclBroadcaster::available(std::string* error) { return absent(error); }
std::optional<std::array<char, 128>> NcclBroadcaster::make_id(std::string* error) { return absent(error), std::nullopt; }
std::unique_ptr<NcclBroadcaster> NcclBroadcaster::create(const std::array<char, 128>&, int, int, int,
                                                         std::chrono::milliseconds, std::string* error,
                                                         const std::atomic<bool>*) {
  return absent(error), nullptr;
}
void NcclBroadcaster::abort() {}
NcclBroadcaster::~NcclBroadcaster() = default;
bool NcclBroadcaster::broadcast(void*, std::size_t, int, std::size_t, std::chrono::milliseconds, std::string* error,
                                const std::atomic<bool>*) {
  return absent(error);
}

#endif

}  // namespace troupe::detail::weights::gpu
