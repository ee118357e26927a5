# Finds every dependency troupe builds against. All are Debian 12 packages
# (scripts/install-deps.sh installs them); CUDA/NCCL are handled in Cuda.cmake.
find_package(Threads REQUIRED)

# CAF 0.17 (the in-process actor system; its middleman, caf_io, is not used): Debian ships no CMake
# package, so cmake/FindCAF.cmake (installed with troupe's package too) makes CAF::core.
list(APPEND CMAKE_MODULE_PATH ${CMAKE_CURRENT_LIST_DIR})
find_package(CAF REQUIRED)
add_library(troupe::caf ALIAS CAF::core)

find_package(ucx REQUIRED)                       # ucx::ucp ucx::ucs
find_package(msgpack REQUIRED)                   # msgpackc-cxx (header-only)
find_package(Boost 1.74 REQUIRED)                # Asio / Beast, header-only
find_package(SQLite3 REQUIRED)
find_package(OpenSSL 3.0 REQUIRED)              # HMAC-SHA256 of the links' handshake
find_package(LibArchive REQUIRED)              # job packages (tar): packed by the CLI, checked and unpacked by the daemons
find_package(PkgConfig REQUIRED)
pkg_check_modules(libelf REQUIRED IMPORTED_TARGET libelf)   # the ELF files a node reads ahead before it starts a program
find_package(doctest REQUIRED)
find_package(CLI11 REQUIRED)
find_package(nlohmann_json REQUIRED)
find_package(spdlog REQUIRED)
find_package(tomlplusplus REQUIRED)

# libtorch is only needed by actors/, rl/ and kernels' adapters; found lazily there via
# troupe_find_torch() so configuring the rest stays fast.
macro(troupe_find_torch)
  if(NOT TARGET torch)
    find_package(Torch REQUIRED)
  endif()
endmacro()
