// The BLAS's own thread pool, process-wide (torch-free). libtorch's set_num_threads sizes its
// OpenMP pool, not the pthread pool of Debian's OpenBLAS (libopenblas0-pthread, libtorch's BLAS
// here), which by default runs every GEMM on every core. That is the fastest while one actor
// computes at a time (GRPO's phases run one after another: its step 151 ms with the default pool,
// 174 ms with 1 thread), and the slowest when several compute side by side in one process (PPO's
// policy and critic train at once: 509 ms a step with the default pool, 307 ms with 1 thread).
// Measured with build/bench/rl_step --algorithms grpo|ppo --blas-threads N, 2 cores, 2026-12-02.
#pragma once

namespace troupe::actors {

// Sets OpenBLAS's threads for the whole process (n >= 1); changes nothing when the process's BLAS
// is not OpenBLAS.
void set_blas_threads(int n);
int blas_threads();   // 0 when the BLAS is not OpenBLAS

// This thread's OpenMP thread count, libtorch's intra-op threads (n >= 1; per thread, unlike
// OpenBLAS's). 0 / nothing when libgomp is not loaded.
int openmp_threads();
void set_openmp_threads(int n);

}  // namespace troupe::actors
