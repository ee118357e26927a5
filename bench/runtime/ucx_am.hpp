// UCX active messages between two processes on this host: the same-host lane that issue 14 names
// as the alternative to links, measured beside them by build/bench/actor_calls.
#pragma once

namespace bench {

struct UcxAmFigures {
  double busy_rtt_us = -1;   // mean 64 B round trip, both sides busy-polling ucp_worker_progress
  double wait_rtt_us = -1;   // the same, each side parking on the worker's event fd between messages
};

// The peer side, when this process was started for it (argv "--ucx-am-peer FD"): runs it and
// returns true; otherwise returns false at once. Call first in main, before anything starts threads.
bool ucx_am_peer(int argc, char** argv);

// Starts this binary again as the peer (exec'd, so it begins clean) and ping-pongs `rounds` 64 B
// active messages with it in each mode, after 1,000 unmeasured ones. -1 figures if UCX fails.
UcxAmFigures ucx_am_rtt(int rounds);

}  // namespace bench
