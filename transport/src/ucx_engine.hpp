// The UCX layer under the data plane: one UCP context, one worker, and one progress thread that
// is the only thread ever to touch the worker, its endpoints and unpacked rkeys. Other threads
// hand it work through a queue and wait on a GetOp with a deadline.
//
// Why one owning thread: the worker runs in UCS_THREAD_MODE_SINGLE (no worker lock), a TCP
// target's "one-sided" get needs the target to progress anyway, and between transfers the thread
// sleeps in poll() on the worker's event fd, so an idle process burns no CPU.
#pragma once

#include <ucp/api/ucp.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace troupe::transport {

class UcxEngine;
struct CachedRkey;

// The UCP context. Outlives the engine while any allocation made through it is alive (holders
// keep a shared_ptr). map/unmap/pack_rkey are thread-safe (own mutex + mt_workers_shared).
class UcxContext {
 public:
  UcxContext();                                   // throws TransportError(Ucx)
  ~UcxContext();
  UcxContext(const UcxContext&) = delete;
  UcxContext& operator=(const UcxContext&) = delete;

  ucp_context_h handle() const { return ctx_; }
  // Registers [addr, addr+len); with addr == nullptr UCP allocates shared memory (peers can map
  // it directly: fastest for gets). Returns the handle and the region's start.
  ucp_mem_h map(void* addr, std::size_t len, void** start);
  void unmap(ucp_mem_h memh) noexcept;
  std::vector<char> pack_rkey(ucp_mem_h memh);

 private:
  std::mutex mu_;
  ucp_context_h ctx_ = nullptr;
};

// One remote read in flight. Created by UcxEngine::get; the caller waits on it. Holds `keep`
// (the destination's owner) until UCX is done with the destination, even after a timeout.
struct GetOp {
  // Inputs, fixed before the op is queued.
  std::string peer;                 // worker address bytes
  std::uint64_t remote_address = 0;
  std::vector<char> rkey;
  void* local = nullptr;
  std::size_t length = 0;
  std::shared_ptr<void> keep;
  // Map instead of read: when the owner's memory is shared memory this process can address
  // (UCX's ucp_rkey_ptr), `mapped` points at remote_address in it and `pin` keeps that mapping
  // (and its rkey) alive until dropped; otherwise the op finishes with UCS_ERR_UNSUPPORTED.
  bool map_only = false;
  const void* mapped = nullptr;
  std::shared_ptr<void> pin;

  // Waits until done or `deadline`; true when done.
  bool wait_until(std::chrono::steady_clock::time_point deadline);
  ucs_status_t status() const;      // valid once done
  const std::string& error() const; // empty when status() == UCS_OK
  void finish(ucs_status_t st, std::string error);

  // Progress-thread state.
  void* request = nullptr;
  CachedRkey* rkey_entry = nullptr;
  ucp_ep_h ep = nullptr;
  UcxEngine* engine = nullptr;

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  ucs_status_t status_ = UCS_INPROGRESS;
  std::string error_;
};

class UcxEngine {
 public:
  // Creates the worker and starts the progress thread. `tick` runs on that thread about once a
  // second (the data plane sweeps expired leases there). Throws TransportError(Ucx).
  UcxEngine(std::shared_ptr<UcxContext> ctx, std::function<void()> tick);
  // Stops and joins the progress thread, fails queued and in-flight gets (UCS_ERR_CANCELED),
  // closes endpoints, destroys the worker. No thread outlives this.
  ~UcxEngine();
  UcxEngine(const UcxEngine&) = delete;
  UcxEngine& operator=(const UcxEngine&) = delete;

  const std::vector<char>& address() const { return address_; }   // this worker's, opaque

  // Queues a read of op->length bytes from the peer into op->local. Thread-safe.
  void submit(const std::shared_ptr<GetOp>& op);
  // Gives up on `op` (its deadline passed): the endpoint it uses is closed by force, which
  // completes every request on it with UCS_ERR_CANCELED. Thread-safe.
  void cancel(const std::shared_ptr<GetOp>& op);

 private:
  void run();
  void drain_inbox();
  void start(const std::shared_ptr<GetOp>& op);
  void map(GetOp& op, ucp_rkey_h rkey);
  void complete(GetOp* op, ucs_status_t st);
  void reap_completed();
  ucp_rkey_h unpack_rkey(GetOp& op, ucs_status_t* st);
  void drop_rkeys(ucp_ep_h ep, bool idle_only);
  ucp_ep_h endpoint(const std::string& peer, ucs_status_t* st);
  void close_ep(ucp_ep_h ep);
  void reap_closing(bool all);
  void wait_for_events(std::chrono::milliseconds timeout);
  void shutdown_all();
  static void on_get_done(void* request, ucs_status_t st, void* user);
  static void on_ep_error(void* arg, ucp_ep_h ep, ucs_status_t st);

  std::shared_ptr<UcxContext> ctx_;
  std::function<void()> tick_;
  ucp_worker_h worker_ = nullptr;
  int efd_ = -1;
  std::vector<char> address_;

  std::mutex inbox_mu_;                               // guards the two queues below
  std::vector<std::shared_ptr<GetOp>> inbox_;
  std::vector<std::shared_ptr<GetOp>> cancels_;
  std::atomic<bool> stop_{false};

  // Progress-thread only.
  std::map<std::string, ucp_ep_h> eps_;               // by peer worker address
  std::map<GetOp*, std::shared_ptr<GetOp>> inflight_;
  // Unpacked rkeys by (ep, packed bytes): re-reading a region (a weight buffer each step) skips
  // the unpack, and on shared memory the segment attach and page-table fill. Dropped after
  // kRkeyIdle unused (the owner's freed memory stays pinned here at most that long) or with the
  // ep; never while a get or a mapping (GetOp::pin) uses it.
  std::map<std::pair<ucp_ep_h, std::string>, std::shared_ptr<CachedRkey>> rkeys_;
  std::vector<std::pair<GetOp*, ucs_status_t>> completed_;   // from UCX callbacks
  std::vector<ucp_ep_h> failed_eps_;
  std::vector<void*> closing_;                        // ep close requests still in progress
  std::thread thread_;
};

// "UCS_ERR_...: message" for errors.
std::string ucs_error(ucs_status_t st);

}  // namespace troupe::transport
