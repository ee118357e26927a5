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
// A worker process allocates from one arena (M_ARENA_MAX 1); a driver keeps glibc's arena per
// thread. A worker hosts the actors placed on it together (a colocated bundle: an RL run's
// trainer, rollout engine and reference), and those of a share group (troupe/share_thread.hpp)
// run their calls on whichever of their threads is free: with an arena per thread, every thread
// that ran a role once faulted in a copy of that role's working set. Measured on this 2-vCPU VM
// (2026-12-06, rl_step's DPO through a worker, 4 alternating pairs of default runs): the trainer's
// own step 1.009-1.043 x the plain loop's with one arena, 1.014-1.167 x with glibc's arenas. The
// price is one lock for the process's allocations: uncontended while its actors take turns, as a
// share group's do; actors of one worker that compute at once (and its io threads) take it in
// turn for each allocation, a tensor op's one or two. A driver, whose threads are the user's,
// keeps an arena each: one lock there would serialise them.
// A setting the environment already gives (MALLOC_ARENA_MAX, MALLOC_TRIM_THRESHOLD_,
// MALLOC_MMAP_THRESHOLD_, MALLOC_TOP_PAD_, or the same in GLIBC_TUNABLES) is left as it says.
#pragma once

namespace troupe::detail {

void keep_tensor_memory(bool worker_process);

}  // namespace troupe::detail
