// Versioned weight hot-swap (ARCHITECTURE §7): a trainer publishes version v of a named set of
// tensors; rollout engines pull v (or the latest) and swap to it between their batches.
//
// Paths, chosen by locality (the manifest names the publisher's process):
//   same process  no copy: the subscriber shares the publisher's immutable WeightSet;
//   same host     the publisher's shared-memory buffer mapped in place (held while mapped), or
//                 copied out of the mapping and hashed in 1 MiB chunks (map_shared = false);
//   other hosts   one UCX get per 64 MiB bucket (TCP or RDMA), hashed as the next is in flight;
//   many hosts    relays: WeightStore::follow in a tree (tree_sources: the publisher serves
//                 `fanout` receivers however many there are), or follow_async / chain_broadcast,
//                 a chain in which each relay serves every bucket as soon as it has landed;
//   GPUs          a publisher's device mirror (PublisherOptions::device) imported by CUDA IPC by
//                 subscribers on the same GPU (SubscriberOptions::device), in place or copied on
//                 the device; subscribers on other GPUs in an NCCL group with the store
//                 (SubscriberOptions::nccl_group) receive it by one broadcast per version.
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
