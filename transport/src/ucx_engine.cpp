#include "ucx_engine.hpp"

#include <poll.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <vector>

#include "troupe/transport/descriptor.hpp"

namespace troupe::transport {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kSpinsBeforeSleep = 2000;            // progress calls before sleeping with gets in flight
constexpr auto kTickEvery = std::chrono::seconds(1);
constexpr auto kCloseGrace = std::chrono::seconds(1);
// Idle cached rkeys (and with them the mappings of other processes' segments) are kept this long
// and at most this many: a publisher recycles its version buffers, so a subscriber that keeps the
// last few mapped pulls each new version without a page-table fill, however long a training step
// takes; the count bounds what a dead segment can keep alive meanwhile.
constexpr auto kRkeyIdle = std::chrono::seconds(60);
constexpr std::size_t kRkeyIdleKept = 4;

[[noreturn]] void fail(const char* what, ucs_status_t st) {
  throw ErrorException(Error{TransportCode::Ucx, std::string(what) + ": " + ucs_error(st)});
}

bool peer_error_mode() {
  static const bool on = [] {
    const char* v = std::getenv("TROUPE_UCX_PEER_ERRORS");
    return v != nullptr && v[0] == '1';
  }();
  return on;
}

}  // namespace

std::string ucs_error(ucs_status_t st) { return ucs_status_string(st); }

struct CachedRkey {
  ucp_rkey_h handle = nullptr;
  // In-flight gets (progress thread) and live mappings (dropped on any thread) using it.
  std::atomic<int> users{0};
  // When the last user let go (a mapping is dropped on any thread): idle from then on.
  std::atomic<Clock::rep> last_used{0};
  void touch() { last_used.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed); }
  bool idle_since(Clock::time_point t) const {
    return last_used.load(std::memory_order_relaxed) < t.time_since_epoch().count();
  }
};

// ---- UcxContext ------------------------------------------------------------------------------

UcxContext::UcxContext() {
  ucp_params_t prm{};
  prm.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  prm.features = UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
  prm.mt_workers_shared = 1;   // map/unmap run on caller threads while the worker runs
  ucp_config_t* cfg = nullptr;
  if (auto st = ucp_config_read(nullptr, nullptr, &cfg); st != UCS_OK) fail("ucp_config_read", st);
  auto st = ucp_init(&prm, cfg, &ctx_);
  ucp_config_release(cfg);
  if (st != UCS_OK) fail("ucp_init", st);
}

UcxContext::~UcxContext() { ucp_cleanup(ctx_); }

ucp_mem_h UcxContext::map(void* addr, std::size_t len, void** start) {
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                  UCP_MEM_MAP_PARAM_FIELD_FLAGS;
  mp.address = addr;
  mp.length = len;
  mp.flags = addr == nullptr ? UCP_MEM_MAP_ALLOCATE : 0;
  std::lock_guard lock(mu_);
  ucp_mem_h memh = nullptr;
  if (auto st = ucp_mem_map(ctx_, &mp, &memh); st != UCS_OK) fail("ucp_mem_map", st);
  ucp_mem_attr_t ma{};
  ma.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS;
  if (auto st = ucp_mem_query(memh, &ma); st != UCS_OK) {
    ucp_mem_unmap(ctx_, memh);
    fail("ucp_mem_query", st);
  }
  *start = ma.address;
  return memh;
}

void UcxContext::unmap(ucp_mem_h memh) noexcept {
  std::lock_guard lock(mu_);
  ucp_mem_unmap(ctx_, memh);
}

std::vector<char> UcxContext::pack_rkey(ucp_mem_h memh) {
  std::lock_guard lock(mu_);
  void* rk = nullptr;
  std::size_t len = 0;
  if (auto st = ucp_rkey_pack(ctx_, memh, &rk, &len); st != UCS_OK) fail("ucp_rkey_pack", st);
  std::vector<char> out(static_cast<char*>(rk), static_cast<char*>(rk) + len);
  ucp_rkey_buffer_release(rk);
  return out;
}

// ---- GetOp -----------------------------------------------------------------------------------

bool GetOp::wait_until(Clock::time_point deadline) {
  std::unique_lock lock(mu_);
  return cv_.wait_until(lock, deadline, [&] { return done_; });
}

ucs_status_t GetOp::status() const { std::lock_guard l(mu_); return status_; }
const std::string& GetOp::error() const { std::lock_guard l(mu_); return error_; }

void GetOp::finish(ucs_status_t st, std::string error) {
  std::shared_ptr<void> keep;
  {
    std::lock_guard lock(mu_);
    if (done_) return;
    done_ = true;
    status_ = st;
    error_ = std::move(error);
    keep = std::move(this->keep);   // UCX no longer writes into the destination
  }
  cv_.notify_all();
}

// ---- UcxEngine: setup, teardown, queue --------------------------------------------------------

UcxEngine::UcxEngine(std::shared_ptr<UcxContext> ctx, std::function<void()> tick)
    : ctx_(std::move(ctx)), tick_(std::move(tick)) {
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;   // only the progress thread touches the worker
  if (auto st = ucp_worker_create(ctx_->handle(), &wp, &worker_); st != UCS_OK) fail("ucp_worker_create", st);
  ucp_address_t* addr = nullptr;
  std::size_t len = 0;
  ucs_status_t st = ucp_worker_get_efd(worker_, &efd_);
  if (st == UCS_OK) st = ucp_worker_get_address(worker_, &addr, &len);
  if (st != UCS_OK) {
    ucp_worker_destroy(worker_);
    fail("ucp worker setup", st);
  }
  address_.assign(reinterpret_cast<char*>(addr), reinterpret_cast<char*>(addr) + len);
  ucp_worker_release_address(worker_, addr);
  thread_ = std::thread([this] { run(); });
}

UcxEngine::~UcxEngine() {
  stop_.store(true);
  ucp_worker_signal(worker_);
  thread_.join();
  ucp_worker_destroy(worker_);
}

void UcxEngine::submit(const std::shared_ptr<GetOp>& op) {
  {
    std::lock_guard lock(inbox_mu_);
    if (stop_.load()) {
      op->finish(UCS_ERR_CANCELED, "data plane is shutting down");
      return;
    }
    inbox_.push_back(op);
  }
  ucp_worker_signal(worker_);
}

void UcxEngine::cancel(const std::shared_ptr<GetOp>& op) {
  {
    std::lock_guard lock(inbox_mu_);
    cancels_.push_back(op);
  }
  ucp_worker_signal(worker_);
}

// ---- progress thread ---------------------------------------------------------------------------

void UcxEngine::run() {
  auto next_tick = Clock::now() + kTickEvery;
  int spins = 0;
  while (!stop_.load(std::memory_order_relaxed)) {
    drain_inbox();
    while (ucp_worker_progress(worker_) != 0) {}
    reap_closing(false);   // also reaps completed gets
    if (Clock::now() >= next_tick) {
      drop_rkeys(nullptr, true);
      if (tick_) tick_();
      next_tick = Clock::now() + kTickEvery;
    }
    if (!inflight_.empty() || !closing_.empty()) {
      if (++spins < kSpinsBeforeSleep) continue;
      spins = 0;
      wait_for_events(std::chrono::milliseconds(1));   // TCP completions also raise the fd
      continue;
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(next_tick - Clock::now());
    wait_for_events(std::max(left, std::chrono::milliseconds(1)));
  }
  shutdown_all();
}

void UcxEngine::wait_for_events(std::chrono::milliseconds timeout) {
  if (ucp_worker_arm(worker_) == UCS_ERR_BUSY) return;   // events pending: progress again
  {
    // Submitters push, then signal: anything pushed after this check raises the fd.
    std::lock_guard lock(inbox_mu_);
    if (!inbox_.empty() || !cancels_.empty() || stop_.load()) return;
  }
  pollfd p{efd_, POLLIN, 0};
  ::poll(&p, 1, static_cast<int>(timeout.count()));
}

void UcxEngine::drain_inbox() {
  std::vector<std::shared_ptr<GetOp>> ops, cancels;
  {
    std::lock_guard lock(inbox_mu_);
    ops.swap(inbox_);
    cancels.swap(cancels_);
  }
  for (auto& op : ops) start(op);
  for (auto& op : cancels) {
    if (inflight_.count(op.get()) != 0 && op->ep != nullptr) close_ep(op->ep);
  }
  auto failed = std::move(failed_eps_);
  failed_eps_.clear();
  for (auto ep : failed) close_ep(ep);
}

void UcxEngine::start(const std::shared_ptr<GetOp>& op) {
  ucs_status_t st = UCS_OK;
  ucp_ep_h ep = endpoint(op->peer, &st);
  if (ep == nullptr) return op->finish(st, "cannot reach the owner: " + ucs_error(st));
  op->ep = ep;
  ucp_rkey_h rkey = unpack_rkey(*op, &st);
  if (rkey == nullptr) return op->finish(st, "cannot map the owner's memory (gone or released): " + ucs_error(st));
  if (op->map_only) return map(*op, rkey);
  op->engine = this;
  inflight_[op.get()] = op;
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.send = &UcxEngine::on_get_done;
  p.user_data = op.get();
  void* req = ucp_get_nbx(ep, op->local, op->length, op->remote_address, rkey, &p);
  if (UCS_PTR_IS_PTR(req)) {
    op->request = req;
    return;
  }
  complete(op.get(), UCS_PTR_STATUS(req));   // completed (or failed) inline
}

void UcxEngine::map(GetOp& op, ucp_rkey_h rkey) {
  std::shared_ptr<CachedRkey> entry;
  for (auto& [key, e] : rkeys_) {
    if (e.get() == op.rkey_entry) { entry = e; break; }
  }
  op.rkey_entry = nullptr;
  void* local = nullptr;
  if (entry == nullptr || ucp_rkey_ptr(rkey, op.remote_address, &local) != UCS_OK) {
    if (entry != nullptr) { entry->touch(); --entry->users; }
    return op.finish(UCS_ERR_UNSUPPORTED, "the owner's memory cannot be mapped here");
  }
  // The pin keeps the entry's user count up: the rkey (and with it the segment's mapping in
  // this process) stays until the pin is dropped, on whatever thread that happens.
  op.mapped = local;
  op.pin = std::shared_ptr<void>(local, [entry](void*) {
    entry->touch();   // before the count drops: the sweep never sees an idle, stale entry
    --entry->users;
  });
  op.finish(UCS_OK, "");
}

void UcxEngine::on_get_done(void* request, ucs_status_t st, void* user) {
  // Only records: rkey and request are released by reap_completed(), outside UCX's stack.
  auto* op = static_cast<GetOp*>(user);
  op->engine->completed_.emplace_back(op, st);
}

void UcxEngine::reap_completed() {
  auto done = std::move(completed_);
  completed_.clear();
  for (auto [op, st] : done) complete(op, st);
}

void UcxEngine::complete(GetOp* op, ucs_status_t st) {
  auto it = inflight_.find(op);
  if (it == inflight_.end()) return;
  std::shared_ptr<GetOp> hold = std::move(it->second);
  inflight_.erase(it);
  if (op->request != nullptr) ucp_request_free(op->request);
  if (op->rkey_entry != nullptr) {
    --op->rkey_entry->users;
    op->rkey_entry->touch();
  }
  op->request = nullptr;
  op->rkey_entry = nullptr;
  op->finish(st, st == UCS_OK ? std::string() : "remote read failed: " + ucs_error(st));
}

// The cached rkey for op's region on op.ep, unpacked on first use. A fresh shared-memory
// mapping is prefaulted in one pass (MADV_POPULATE_READ): far cheaper than a fault per page.
ucp_rkey_h UcxEngine::unpack_rkey(GetOp& op, ucs_status_t* st) {
  auto& slot = rkeys_[{op.ep, std::string(op.rkey.begin(), op.rkey.end())}];
  if (!slot) {
    auto entry = std::make_shared<CachedRkey>();
    *st = ucp_ep_rkey_unpack(op.ep, op.rkey.data(), &entry->handle);
    if (*st != UCS_OK) {
      rkeys_.erase({op.ep, std::string(op.rkey.begin(), op.rkey.end())});
      return nullptr;
    }
    void* local = nullptr;
    if (ucp_rkey_ptr(entry->handle, op.remote_address, &local) == UCS_OK) {
      auto page = std::uintptr_t(::sysconf(_SC_PAGESIZE));
      auto start = reinterpret_cast<std::uintptr_t>(local) & ~(page - 1);
      ::madvise(reinterpret_cast<void*>(start), reinterpret_cast<std::uintptr_t>(local) + op.length - start,
                MADV_POPULATE_READ);   // advice only
    }
    slot = std::move(entry);
  }
  ++slot->users;
  op.rkey_entry = slot.get();
  return slot->handle;
}

// Destroys cached rkeys no get or mapping is using: those of `ep`, or (idle_only) those unused for
// kRkeyIdle and all but the kRkeyIdleKept most recently used.
void UcxEngine::drop_rkeys(ucp_ep_h ep, bool idle_only) {
  auto cutoff = Clock::now() - kRkeyIdle;
  std::vector<Clock::rep> idle_times;
  if (idle_only) {
    for (const auto& [key, e] : rkeys_) {
      if (e->users == 0) idle_times.push_back(e->last_used.load(std::memory_order_relaxed));
    }
  }
  if (idle_times.size() > kRkeyIdleKept) {   // keep the most recent ones only
    std::nth_element(idle_times.begin(), idle_times.begin() + (kRkeyIdleKept - 1), idle_times.end(), std::greater<>());
    auto kept_from = Clock::time_point(Clock::duration(idle_times[kRkeyIdleKept - 1]));
    cutoff = std::max(cutoff, kept_from);
  }
  for (auto it = rkeys_.begin(); it != rkeys_.end();) {
    auto& e = *it->second;
    bool match = e.users == 0 && (idle_only ? e.idle_since(cutoff) : it->first.first == ep);
    if (!match) { ++it; continue; }
    ucp_rkey_destroy(e.handle);
    it = rkeys_.erase(it);
  }
}

ucp_ep_h UcxEngine::endpoint(const std::string& peer, ucs_status_t* st) {
  if (auto it = eps_.find(peer); it != eps_.end()) return it->second;
  ucp_ep_params_t ep_p{};
  ep_p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep_p.address = reinterpret_cast<const ucp_address_t*>(peer.data());
  // PEER mode would make UCX 1.13 drop sysv/posix/cma (they cannot detect peer failure) and run
  // gets over TCP at ~1/10 the speed. In NONE mode a transport error (CMA on a dead pid, a reset
  // TCP connection) still fails the ep and its requests through on_ep_error; a silent peer is
  // caught by the fetch deadline. TROUPE_UCX_PEER_ERRORS=1 selects PEER mode (keepalive).
  ep_p.err_mode = peer_error_mode() ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
  ep_p.err_handler.cb = &UcxEngine::on_ep_error;
  ep_p.err_handler.arg = this;
  ucp_ep_h ep = nullptr;
  *st = ucp_ep_create(worker_, &ep_p, &ep);
  if (*st != UCS_OK) return nullptr;
  if (std::getenv("TROUPE_UCX_PRINT_EP") != nullptr) ucp_ep_print_info(ep, stderr);   // lanes chosen
  eps_[peer] = ep;
  return ep;
}

void UcxEngine::on_ep_error(void* arg, ucp_ep_h ep, ucs_status_t st) {
  static_cast<UcxEngine*>(arg)->failed_eps_.push_back(ep);   // closed by drain_inbox()
}

// Forgets `ep` and closes it by force: UCX completes its requests with an error (CANCELED, or
// the transport's error), which reap_completed() turns into finished GetOps.
void UcxEngine::close_ep(ucp_ep_h ep) {
  bool known = false;
  for (auto it = eps_.begin(); it != eps_.end(); ++it) {
    if (it->second == ep) { eps_.erase(it); known = true; break; }
  }
  if (!known) return;   // already closed (e.g. an error after a cancel)
  drop_rkeys(ep, false);   // unused ones go before the ep, as UCX prefers
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_EP_CLOSE_FLAG_FORCE;
  void* req = ucp_ep_close_nbx(ep, &p);
  if (UCS_PTR_IS_PTR(req)) closing_.push_back(req);
  reap_completed();
  // Requests that UCX did not complete on close still reference this ep: fail them now.
  std::vector<GetOp*> stale;
  for (auto& [op, hold] : inflight_) if (op->ep == ep) stale.push_back(op);
  for (auto* op : stale) complete(op, UCS_ERR_CANCELED);
  drop_rkeys(ep, false);   // the rest, now that no request uses them
}

void UcxEngine::reap_closing(bool all) {
  reap_completed();
  auto deadline = Clock::now() + kCloseGrace;
  do {
    for (auto it = closing_.begin(); it != closing_.end();) {
      if (ucp_request_check_status(*it) == UCS_INPROGRESS) { ++it; continue; }
      ucp_request_free(*it);
      it = closing_.erase(it);
    }
    if (!all || closing_.empty()) return;
    ucp_worker_progress(worker_);
  } while (Clock::now() < deadline);
}

void UcxEngine::shutdown_all() {
  std::vector<std::shared_ptr<GetOp>> queued;
  {
    std::lock_guard lock(inbox_mu_);
    queued.swap(inbox_);
    cancels_.clear();
  }
  for (auto& op : queued) op->finish(UCS_ERR_CANCELED, "data plane is shutting down");
  while (!eps_.empty()) close_ep(eps_.begin()->second);
  reap_closing(true);
  while (!inflight_.empty()) complete(inflight_.begin()->first, UCS_ERR_CANCELED);
}

}  // namespace troupe::transport
