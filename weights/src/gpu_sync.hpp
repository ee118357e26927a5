// GPU paths of the weight store: CUDA IPC (processes on one GPU share a device buffer; the reader
// copies device-to-device or uses it in place), device buffers, and an NCCL broadcast of a device
// buffer within a group (one rank per GPU). gpu_sync.cpp holds the CUDA runtime calls (compiled
// in when CUDA is found: TROUPE_WEIGHTS_GPU), nccl_broadcast.cpp the NCCL ones (when NCCL is
// found: TROUPE_WEIGHTS_NCCL); otherwise every function reports unavailability and the CPU paths
// are used. No CUDA type appears here, so CPU-only consumers compile without the toolkit.
//
// Errors: every function returns false / an empty optional / nullptr and fills `error` (the
// CUDA/NCCL message) instead of throwing; none aborts on a machine without a driver or a device.
// Thread safety: a NcclBroadcaster is used by one thread at a time; the rest is safe. Every call
// leaves the calling thread's current device as it found it, except a thread on the default
// device 0 in a process that never used GPU 0: it is left on the device used (cuda_status.hpp).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace troupe::detail::weights::gpu {

bool compiled();                       // true when built against CUDA
int device_count(std::string* error);  // 0 when no usable device (or not compiled)

// The device's UUID: the same GPU has the same UUID in every process, whatever its index there
// (CUDA_VISIBLE_DEVICES renumbers devices per process).
std::optional<std::array<char, 16>> device_uuid(int device, std::string* error);

// A device buffer exported to other processes (cudaIpcGetMemHandle). Plain bytes: ship it in a
// manifest. Valid while the exporting process keeps the buffer allocated.
struct IpcHandle {
  std::array<char, 64> bytes{};
  std::uint64_t nbytes = 0;
  int device = 0;
};
std::optional<IpcHandle> export_buffer(void* device_ptr, std::size_t nbytes, int device, std::string* error);

// An imported buffer: opened with cudaIpcOpenMemHandle, closed by the destructor.
class IpcMapping {
 public:
  static std::unique_ptr<IpcMapping> open(const IpcHandle& h, std::string* error);
  ~IpcMapping();
  void* data() const { return ptr_; }
  std::size_t size() const { return n_; }
  int device() const { return device_; }
  // Device-to-device copy of the whole buffer into `dst` (a device pointer on the same device),
  // landed when this returns.
  bool copy_to(void* dst, std::string* error) const;

 private:
  IpcMapping(void* p, std::size_t n, int device) : ptr_(p), n_(n), device_(device) {}
  void* ptr_;
  std::size_t n_;
  int device_;
};

// A device allocation (cudaMalloc), freed by the destructor. Copies are synchronous: when one
// returns true the bytes are in place.
class DeviceBuffer {
 public:
  static std::unique_ptr<DeviceBuffer> allocate(std::size_t nbytes, int device, std::string* error);
  ~DeviceBuffer();
  void* data() const { return ptr_; }
  std::size_t size() const { return n_; }
  int device() const { return device_; }
  bool upload(const void* host, std::size_t n, std::string* error);           // host -> here
  bool copy_from(const void* device_src, std::size_t n, std::string* error);  // device -> here

 private:
  DeviceBuffer(void* p, std::size_t n, int device) : ptr_(p), n_(n), device_(device) {}
  void* ptr_;
  std::size_t n_;
  int device_;
};

// Copies `n` bytes of device memory at `device_src` (on `device`) to host memory.
bool copy_to_host(const void* device_src, std::size_t n, void* host, int device, std::string* error);

// cudaMemcpy device-to-device bandwidth on `device` for `nbytes` (best of 3, GB/s), the
// reference of the GPU rows of build/bench/weight_sync; 0 on error.
double copy_gbps(std::size_t nbytes, int device, std::string* error);

// One NCCL communicator over `nranks` ranks (one GPU each: NCCL refuses two ranks on one GPU).
// Rank 0 makes the unique id (128 opaque bytes) and ships it to the others over the control plane.
// libnccl.so.2 is loaded (dlopen) on first use, so programs that never broadcast do not load it.
// The communicator is non-blocking: joining and broadcasting wait with a deadline, and past it
// the communicator is aborted, so a rank that died or never came cannot hang the others.
class NcclBroadcaster {
 public:
  // True when the build has NCCL and libnccl.so.2 loads here.
  static bool available(std::string* error);
  static std::optional<std::array<char, 128>> make_id(std::string* error);
  // Joins the communicator as `rank` on `device`; returns once every rank has joined. nullptr on
  // error, past `timeout`, or when `stop` (optional) becomes true: the half-made communicator is
  // aborted then.
  static std::unique_ptr<NcclBroadcaster> create(const std::array<char, 128>& id, int rank, int nranks, int device,
                                                 std::chrono::milliseconds timeout, std::string* error,
                                                 const std::atomic<bool>* stop = nullptr);
  ~NcclBroadcaster();
  // Broadcasts `nbytes` at `buf` (device memory on this rank's device) from `root` to every rank,
  // in buckets of `bucket` bytes (pipelined by NCCL on one stream); returns once the stream is
  // done. False on error, past `timeout` or on `stop`: the communicator is then aborted.
  bool broadcast(void* buf, std::size_t nbytes, int root, std::size_t bucket, std::chrono::milliseconds timeout,
                 std::string* error, const std::atomic<bool>* stop = nullptr);
  // Aborts the communicator (its in-flight operations with it); every later broadcast fails.
  void abort();

 private:
  NcclBroadcaster() = default;
  void* comm_ = nullptr;     // ncclComm_t; null once aborted
  void* stream_ = nullptr;   // cudaStream_t
  int device_ = 0;
};

}  // namespace troupe::detail::weights::gpu
