#pragma once
// Function multi-versioning for the hot CPU loops: x86-64 builds carry AVX-512, AVX2 and baseline
// clones of a function and pick one at load time (glibc ifunc). Elsewhere it expands to nothing.

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#define TROUPE_SIMD_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define TROUPE_SIMD_CLONES
#endif
