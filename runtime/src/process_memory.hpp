// How a troupe process uses glibc's malloc, set once by troupe::init before the runtime starts a
// thread (a worker process included: it takes the same path).
//
// Actors allocate and free the same large tensors every step, on their own threads. With glibc's
// defaults that memory goes back to the kernel between steps and comes back as fresh pages, each
// a page fault (~5-15 us on a VM with page-table isolation, 2026-12-04): every thread but main
// gets an arena of its own, made of 64 MiB heaps, and a heap left empty at a step's end is
// unmapped whatever the trim threshold says. A trainer whose step needs a little over one heap
// then maps and faults in a new one every step: in rl_step's GRPO with worker processes, ~1,600
// more faults a step and a train phase of 114 ms instead of 67, in the runs whose arena happened to
// land on that edge (2 of 6 on 2026-12-04), none in the others. So:
//   - one arena (M_ARENA_MAX 1): every thread allocates from main's heap, which only the trim
//     threshold shrinks; threads still cache small blocks of their own (tcache), lock-free;
//   - freed memory kept up to 1 GiB at the heap's top (M_TRIM_THRESHOLD; glibc's default trims
//     at 128 KiB: the rollout's tensors cost ~10 ms of a 60 ms phase in faults, measured earlier);
//   - blocks under 64 MiB from the heap, not a mapping of their own (M_MMAP_THRESHOLD).
// A setting the environment already gives (MALLOC_ARENA_MAX, MALLOC_TRIM_THRESHOLD_,
// MALLOC_MMAP_THRESHOLD_, or the same in GLIBC_TUNABLES) is left as it says.
#pragma once

namespace troupe::detail {

struct MallocSettings {
  bool arena_max = false;        // which of the three this call set
  bool trim_threshold = false;
  bool mmap_threshold = false;
};

MallocSettings keep_tensor_memory();

}  // namespace troupe::detail
