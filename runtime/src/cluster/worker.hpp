// Worker mode: a job's own binary, started by a node daemon with --troupe-worker <id>, hosts
// actors instead of running main. troupe::init calls run_worker, which never returns.
#pragma once

namespace troupe::detail {

// Publishes a gateway, tells the head it is up, then constructs, serves and stops the actors the
// head assigns until told to exit, its node is declared dead, or the head stays unreachable.
[[noreturn]] void run_worker(const char* worker_id);

}  // namespace troupe::detail
