#!/usr/bin/env bash
# Packs the troupe binaries that bench/device/weight_sync.sh runs on a GPU machine (which has CUDA
# but none of troupe's Debian libraries) into one folder: the binaries of a CUDA build, the
# shared libraries they load beyond glibc/libstdc++, and UCX's shared-memory module.
#   scripts/device-bundle.sh [BUILD_DIR=build] [DEST=.devbundle]
# Then, on the GPU machine, from the repository root:
#   LD_LIBRARY_PATH=$PWD/DEST/lib UCX_MODULE_DIR=$PWD/DEST/ucx TROUPE_BIN=DEST bash bench/device/weight_sync.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
DEST=${2:-.devbundle}
grep -q 'TROUPE_HAVE_CUDA:INTERNAL=ON\|troupe: CUDA ON' "$BUILD/CMakeCache.txt" 2>/dev/null ||
  ldd "$BUILD/bench/weight_sync" | grep -q libcudart || { echo "$BUILD is not a CUDA build (no nvcc found at configure?)"; exit 1; }
cmake --build "$BUILD" --target bench_weight_sync integration_tests runtime_tests -j2 >/dev/null
rm -rf "$DEST"
mkdir -p "$DEST/lib" "$DEST/ucx"
cp "$BUILD/bench/weight_sync" "$BUILD/bin/integration_tests" "$BUILD/bin/runtime_tests" "$DEST/"
UCX_MODULES=$(dirname "$(ldconfig -p | awk '/libucp.so.0 /{print $NF; exit}')")/ucx
cp -L "$UCX_MODULES/libuct_cma.so.0" "$DEST/ucx/"
for bin in "$DEST"/weight_sync "$DEST"/integration_tests "$DEST"/runtime_tests "$DEST/ucx/libuct_cma.so.0"; do
  ldd "$bin" | awk '$3 ~ /^\// {print $3}'
done | sort -u | grep -vE '/(libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt|ld-linux-x86-64)\.so' |
  while read -r lib; do cp -L "$lib" "$DEST/lib/"; done
du -sh "$DEST"
