// How a troupe process uses glibc's malloc, set once by troupe::init before the runtime starts a
// thread (a worker process included: it takes the same path).
//
// Actors allocate and free the same large tensors every step, on their own threads. With glibc's
// defaults that memory goes back to the kernel between steps and comes back as fresh pages, each
// a page fault (~5-15 us on this project's PVM guests, where each fault goes through the host;
// 2026-12-04). Three settings keep it:
//   - freed memory kept up to 1 GiB at a heap's top (M_TRIM_THRESHOLD; glibc's default trims at
//     128 KiB: the rollout's tensors cost ~10 ms of a 60 ms phase in faults, measured earlier);
//   - blocks under 64 MiB from the heap, not a mapping of their own (M_MMAP_THRESHOLD);
//   - a 64 MiB top pad (M_TOP_PAD). Every thread but main allocates from an arena of 64 MiB heaps,
//     and glibc unmaps a heap left empty whatever the trim threshold says, unless the heap before
//     it has less room than the pad (then it keeps it: heap_trim), which with 64 MiB is always.
//     Without it a trainer whose step needs a little over one heap mapped and faulted in a new one
//     every step: in rl_step's GRPO with worker processes, ~1,600 more faults a step and a train
//     phase of 114 ms instead of 67, in the runs whose arena happened to land on that edge (2 of 6
//     on 2026-12-04). The pad is address space, not memory: a page costs only once written.
// One arena for all (M_ARENA_MAX 1) ends it too, but puts every thread's allocations behind one
// lock: no difference on this 2-vCPU VM (actor_calls, same-hour pairs), a serialisation on a node
// with many actor threads.
// A setting the environment already gives (MALLOC_TRIM_THRESHOLD_, MALLOC_MMAP_THRESHOLD_,
// MALLOC_TOP_PAD_, or the same in GLIBC_TUNABLES) is left as it says.
#pragma once

namespace troupe::detail {

void keep_tensor_memory();

}  // namespace troupe::detail
