#include "troupe/actors/blas.hpp"

#include <dlfcn.h>

#include <algorithm>

namespace troupe::actors {
namespace {

// Looked up at run time: libtorch links the system's libblas, which is OpenBLAS only when
// Debian's alternatives say so.
struct OpenBlas {
  void (*set)(int) = nullptr;
  int (*get)() = nullptr;
  OpenBlas() {
    set = reinterpret_cast<void (*)(int)>(::dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
    get = reinterpret_cast<int (*)()>(::dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
    if (set == nullptr || get == nullptr) set = nullptr, get = nullptr;
  }
};

const OpenBlas& openblas() {
  static const OpenBlas o;
  return o;
}

}  // namespace

void set_blas_threads(int n) {
  if (openblas().set != nullptr) openblas().set(std::max(1, n));
}

int blas_threads() { return openblas().get ? openblas().get() : 0; }

}  // namespace troupe::actors
