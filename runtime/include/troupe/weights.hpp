// Versioned weight hot-swap (ARCHITECTURE §7): a trainer publishes version v of a named set of
// tensors; rollout engines pull v (or the latest) and swap to it between their batches.
//
// Paths, chosen by locality (the manifest names the publisher's process):
//   same process  no copy: the subscriber shares the publisher's immutable WeightSet;
//   other process one UCX get per 64 MiB bucket out of the publisher's shared-memory buffer
//                 (sysv/posix/CMA on one host, TCP or RDMA across hosts), hashed as it lands;
//   many hosts    WeightStore::follow: each receiver pulls from a parent store in a tree, so the
//                 publisher serves `fanout` receivers however many there are (weight_tree.hpp);
//   GPUs          NCCL broadcast / CUDA IPC (runtime/src/weights/gpu_sync.hpp, GPU builds).
// Optional wire compression (bf16, int8 per row) is applied once at publish and undone on
// receipt; bounds in WireCompression below.
//
// Invariants: WS-1 a subscriber never sees a version whose bytes failed the 64-bit checksum
// taken at publish (a torn or mixed transfer is refused, never swapped in). WS-2 a version's
// buffers are reused only when no WeightSet handle, no transfer hold and no exposed region
// refers to them (reference counts; remote holds end on release() or after their lease).
#pragma once

#include "troupe/weight_set.hpp"
#include "troupe/weight_store.hpp"
#include "troupe/weight_types.hpp"
