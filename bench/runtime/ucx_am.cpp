// See ucx_am.hpp. UCP AM with error mode NONE, which lets UCX pick shared memory (sysv) on one
// host; the peer echoes each message back on its own endpoint.
#include "ucx_am.hpp"

#include "../../tests/support/pipe_io.hpp"   // read_exact, write_exact

#include <poll.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

extern char** environ;

namespace bench {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::uint16_t kAmId = 7;
constexpr char kBusy = 'b', kWait = 'w', kQuit = 'q';

// One side: a UCP context, worker and endpoint to the other side, and what has arrived.
struct Side {
  ucp_context_h ctx = nullptr;
  ucp_worker_h worker = nullptr;
  ucp_ep_h ep = nullptr;
  int efd = -1;
  int got = 0;
  char last = 0;

  static ucs_status_t on_am(void* arg, const void*, std::size_t, void* data, std::size_t len,
                            const ucp_am_recv_param_t* param) {
    auto* s = static_cast<Side*>(arg);
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) return UCS_ERR_UNSUPPORTED;   // 64 B: never
    s->last = len > 0 ? static_cast<const char*>(data)[0] : 0;
    ++s->got;
    return UCS_OK;
  }

  // Sets up and swaps worker addresses with the other side over `fd`.
  bool open(int fd) {
    ucp_params_t prm{};
    prm.field_mask = UCP_PARAM_FIELD_FEATURES;
    prm.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
    ucp_config_t* cfg = nullptr;
    if (ucp_config_read(nullptr, nullptr, &cfg) != UCS_OK) return false;
    const ucs_status_t st = ucp_init(&prm, cfg, &ctx);
    ucp_config_release(cfg);
    if (st != UCS_OK) return false;
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    if (ucp_worker_create(ctx, &wp, &worker) != UCS_OK) return false;
    if (ucp_worker_get_efd(worker, &efd) != UCS_OK) return false;
    ucp_am_handler_param_t hp{};
    hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG |
                    UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
    hp.id = kAmId;
    hp.cb = &Side::on_am;
    hp.arg = this;
    hp.flags = UCP_AM_FLAG_WHOLE_MSG;
    if (ucp_worker_set_am_recv_handler(worker, &hp) != UCS_OK) return false;
    ucp_address_t* addr = nullptr;
    std::size_t alen = 0;
    if (ucp_worker_get_address(worker, &addr, &alen) != UCS_OK) return false;
    const std::uint64_t n = alen;
    bool sent = true;
    try {
      test_support::write_exact(fd, &n, sizeof n);
      test_support::write_exact(fd, addr, alen);
    } catch (const std::runtime_error&) {   // the other side has gone
      sent = false;
    }
    ucp_worker_release_address(worker, addr);
    const auto deadline = Clock::now() + std::chrono::seconds(30);
    std::uint64_t peer_len = 0;
    if (!sent || !test_support::read_exact(fd, &peer_len, sizeof peer_len, deadline) || peer_len == 0 ||
        peer_len > (1u << 20)) {
      return false;
    }
    std::vector<char> peer(peer_len);
    if (!test_support::read_exact(fd, peer.data(), peer.size(), deadline)) return false;
    ucp_ep_params_t ep_p{};
    ep_p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    ep_p.address = reinterpret_cast<const ucp_address_t*>(peer.data());
    ep_p.err_mode = UCP_ERR_HANDLING_MODE_NONE;   // PEER mode would leave shared memory for tcp
    return ucp_ep_create(worker, &ep_p, &ep) == UCS_OK;
  }

  bool send(char what) {
    char msg[64] = {what};
    ucp_request_param_t sp{};
    void* r = ucp_am_send_nbx(ep, kAmId, nullptr, 0, msg, sizeof msg, &sp);
    if (r == nullptr) return true;   // done inline (eager short)
    if (UCS_PTR_IS_ERR(r)) return false;
    while (ucp_request_check_status(r) == UCS_INPROGRESS) ucp_worker_progress(worker);
    ucp_request_free(r);
    return true;
  }

  // Until message number `n` has arrived: busy-polling, or parked on the worker's event fd between
  // progress calls. False past `deadline` (the other side is gone).
  bool await(int n, bool busy, Clock::time_point deadline) {
    while (got < n) {
      if (ucp_worker_progress(worker) != 0) continue;
      if (Clock::now() > deadline) return false;
      if (busy) continue;
      if (ucp_worker_arm(worker) == UCS_OK) {   // UCS_ERR_BUSY: events pending, progress again
        pollfd p{efd, POLLIN, 0};
        ::poll(&p, 1, 100);
      }
    }
    return true;
  }

  ~Side() {
    if (ep != nullptr) {
      ucp_request_param_t cp{};
      cp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      cp.flags = UCP_EP_CLOSE_FLAG_FORCE;
      void* r = ucp_ep_close_nbx(ep, &cp);
      if (r != nullptr && !UCS_PTR_IS_ERR(r)) {
        while (ucp_request_check_status(r) == UCS_INPROGRESS) ucp_worker_progress(worker);
        ucp_request_free(r);
      }
    }
    if (worker != nullptr) ucp_worker_destroy(worker);
    if (ctx != nullptr) ucp_cleanup(ctx);
  }
};

}  // namespace

bool ucx_am_peer(int argc, char** argv) {
  if (argc < 3 || std::strcmp(argv[1], "--ucx-am-peer") != 0) return false;
  ::alarm(120);   // whatever happens to the measuring side, this process ends
  const int fd = std::atoi(argv[2]);
  Side s;
  if (!s.open(fd)) return true;
  ::close(fd);
  bool busy = false;
  for (int n = 1;; ++n) {   // echo each message; wait the way the last one said
    if (!s.await(n, busy, Clock::now() + std::chrono::seconds(60)) || s.last == kQuit) break;
    busy = s.last == kBusy;
    if (!s.send(s.last)) break;
  }
  return true;
}

UcxAmFigures ucx_am_rtt(int rounds) {
  UcxAmFigures out;
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) return out;
  const std::string peer_fd = std::to_string(fds[1]);
  char arg0[] = "actor_calls", arg1[] = "--ucx-am-peer";
  char* argv[] = {arg0, arg1, const_cast<char*>(peer_fd.c_str()), nullptr};
  pid_t pid = 0;
  const int spawned = ::posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv, environ);
  ::close(fds[1]);
  if (spawned != 0) {
    ::close(fds[0]);
    return out;
  }
  {
    Side s;
    const bool opened = s.open(fds[0]);
    ::close(fds[0]);
    int n = 0;
    auto phase = [&](char mode) -> double {
      const bool busy = mode == kBusy;
      const auto deadline = Clock::now() + std::chrono::seconds(60);
      for (int i = 0; i < 1000; ++i) {
        if (!s.send(mode) || !s.await(++n, busy, deadline)) return -1;
      }
      const auto t0 = Clock::now();
      for (int i = 0; i < rounds; ++i) {
        if (!s.send(mode) || !s.await(++n, busy, deadline)) return -1;
      }
      return std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / rounds;
    };
    if (opened) {
      out.busy_rtt_us = phase(kBusy);
      if (out.busy_rtt_us > 0) out.wait_rtt_us = phase(kWait);
      s.send(kQuit);
    }
  }
  ::kill(pid, SIGTERM);
  ::waitpid(pid, nullptr, 0);
  return out;
}

}  // namespace bench
