#include "troupe/actors/blas.hpp"

#include <dlfcn.h>

#include <algorithm>

namespace troupe::actors {
namespace {

// A library's thread-count getter and setter, looked up at run time: libtorch links the system's
// libblas, which is OpenBLAS only when Debian's alternatives say so, and libgomp, which troupe
// does not link itself. Both null when either is missing.
struct ThreadCount {
  int (*get)() = nullptr;
  void (*set)(int) = nullptr;
  ThreadCount(const char* getter, const char* setter) {
    get = reinterpret_cast<int (*)()>(::dlsym(RTLD_DEFAULT, getter));
    set = reinterpret_cast<void (*)(int)>(::dlsym(RTLD_DEFAULT, setter));
    if (get == nullptr || set == nullptr) get = nullptr, set = nullptr;
  }
};

const ThreadCount& openblas() {
  static const ThreadCount c("openblas_get_num_threads", "openblas_set_num_threads");
  return c;
}

const ThreadCount& openmp() {
  static const ThreadCount c("omp_get_max_threads", "omp_set_num_threads");
  return c;
}

}  // namespace

void set_blas_threads(int n) {
  if (openblas().set != nullptr) openblas().set(std::max(1, n));
}

int blas_threads() { return openblas().get ? openblas().get() : 0; }

int openmp_threads() { return openmp().get ? openmp().get() : 0; }

void set_openmp_threads(int n) {
  if (openmp().set != nullptr) openmp().set(std::max(1, n));
}

}  // namespace troupe::actors
