#!/usr/bin/env bash
# Builds and measures the weight store's GPU paths on a GPU machine with nvcc + NCCL alone (no
# CMake packages, no network): CUDA IPC from a publisher to 1/2/4 reader processes on one GPU,
# and NCCL broadcast over every visible GPU, both checked and timed against cudaMemcpy D2D.
# Runs from the repository root in about a minute. Prints a table last.
# Exit status: 0 every check passed, 1 a check failed, 2 no usable GPU, 3 build failed.
set -euo pipefail
cd "$(dirname "$0")/../.."
CUDA=${CUDA:-/usr/local/cuda}
BUILD=${BUILD:-${TMPDIR:-/tmp}/troupe-weights-device}
mkdir -p "$BUILD"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
NCCL_INC=$(dirname "$(find "$CUDA/include" /usr/include -maxdepth 2 -name nccl.h 2>/dev/null | head -1)" 2>/dev/null || true)
NCCL_LIB=$(dirname "$(find "$CUDA/lib64" "$CUDA/lib" /usr/lib/x86_64-linux-gnu -maxdepth 2 -name 'libnccl.so*' 2>/dev/null | head -1)" 2>/dev/null || true)
[[ -n $NCCL_INC && -n $NCCL_LIB ]] || { echo "nccl.h / libnccl not found under $CUDA"; exit 3; }
echo "== build in $BUILD (nccl: $NCCL_INC, $NCCL_LIB)"
g++ -std=c++20 -O2 -I"$CUDA/include" -I"$NCCL_INC" -Iruntime/src \
  runtime/src/weights/gpu_sync.cpp bench/device/weight_sync_check.cpp \
  -L"$CUDA/lib64" -L"$NCCL_LIB" -Wl,-rpath,"$CUDA/lib64:$NCCL_LIB" -lnccl -lcudart -lpthread \
  -o "$BUILD/weight_sync_check" || exit 3
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
timeout 240 "$BUILD/weight_sync_check"
