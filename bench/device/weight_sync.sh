#!/usr/bin/env bash
# Builds and measures the weight store's GPU paths on a GPU machine (H200, CUDA 13, no network).
#  1. the raw paths, built here with g++ against CUDA + NCCL alone (no CMake packages): CUDA IPC
#     from a publisher to 1/2/4 reader processes on one GPU, and NCCL broadcast over every
#     visible GPU, both checked and timed against cudaMemcpy D2D;
#  2. the WeightStore's own GPU paths (PublisherOptions::device / SubscriberOptions::device: CUDA
#     IPC on one GPU; with 2+ GPUs, SubscriberOptions::nccl_group broadcasts), from
#     troupe binaries built elsewhere with CUDA (that machine has no CAF/UCX packages): set
#     TROUPE_BIN to a folder with weight_sync, integration_tests and runtime_tests, and
#     LD_LIBRARY_PATH to their libraries (scripts/device-bundle.sh makes both). Skipped without it.
# Runs from the repository root in a few minutes; prints a short table last.
# Exit status: 0 every check passed, 1 a check failed, 2 no usable GPU, 3 build failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
CUDA=${CUDA:-/usr/local/cuda}
BUILD=${BUILD:-${TMPDIR:-/tmp}/troupe-weights-device}
OUTDIR=${OUT:-$BUILD}
mkdir -p "$BUILD" "$OUTDIR"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
# NCCL: the toolkit's, or the one PyTorch's wheels carry (nvidia-nccl-*).
find_nccl() {  # find_nccl <file> : the folder holding it
  local dirs=("$CUDA/include" "$CUDA/lib64" "$CUDA/lib" /usr/include /usr/lib/x86_64-linux-gnu)
  local py
  py=$(python3 -c 'import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])' 2>/dev/null) && dirs+=("$py/include" "$py/lib")
  dirname "$(find "${dirs[@]}" -maxdepth 2 -name "$1" 2>/dev/null | head -1)" 2>/dev/null
}
NCCL_INC=$(find_nccl nccl.h)
NCCL_LIB=$(find_nccl 'libnccl.so*')
[[ -n $NCCL_INC && $NCCL_INC != . && -n $NCCL_LIB && $NCCL_LIB != . ]] || { echo "nccl.h / libnccl not found"; exit 3; }
# troupe opens libnccl.so.2 with dlopen: let the loader find this one.
[[ -e $NCCL_LIB/libnccl.so.2 ]] || ln -sf "$(ls "$NCCL_LIB"/libnccl.so* | head -1)" "$BUILD/libnccl.so.2"
export LD_LIBRARY_PATH="$NCCL_LIB:$BUILD${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
echo "== 1. raw CUDA IPC and NCCL: build in $BUILD (nccl: $NCCL_INC, $NCCL_LIB)"
g++ -std=c++20 -O2 -I"$CUDA/include" -I"$NCCL_INC" -Iweights/src -Ibase/include -DTROUPE_WEIGHTS_GPU=1 -DTROUPE_WEIGHTS_NCCL=1 \
  weights/src/gpu_sync.cpp weights/src/nccl_broadcast.cpp bench/device/weight_sync_check.cpp \
  -L"$CUDA/lib64" -Wl,-rpath,"$CUDA/lib64" -lcudart -ldl -lpthread \
  -o "$BUILD/weight_sync_check" || exit 3
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
timeout 240 "$BUILD/weight_sync_check" | tee "$OUTDIR/weight_sync_raw.txt"
rc=${PIPESTATUS[0]}
[[ $rc -eq 2 ]] && exit 2

if [[ -n ${TROUPE_BIN:-} ]]; then
  echo "== 2. the WeightStore's GPU path ($TROUPE_BIN)"
  for t in "runtime_tests -tc=weight*device*" "integration_tests -tc=weights*GPU*"; do
    set -- $t
    if log=$(timeout 180 "$TROUPE_BIN/$1" "$2" 2>&1); then echo "$log" | tail -3; else echo "$log"; echo "FAIL: $t"; rc=1; fi
  done
  timeout 400 "$TROUPE_BIN/weight_sync" --device 0 --sizes-mib 64,512,2048 --reps 2 >"$OUTDIR/weight_sync_store.json" \
    2>"$OUTDIR/weight_sync_store.log" || { echo "FAIL: weight_sync --device 0"; tail -5 "$OUTDIR/weight_sync_store.log"; rc=1; }
fi

echo
cat "$OUTDIR/weight_sync_raw.txt" | sed -n '/== weight sync on GPU/,$p'
if [[ -s $OUTDIR/weight_sync_store.json ]]; then
  python3 - "$OUTDIR/weight_sync_store.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))["results"]
print("\n== WeightStore: same_gpu (CUDA IPC between processes), nccl_group (NCCL broadcast to other GPUs);")
print("   best of 2 rounds, each a new version")
print(f"{'path':10} {'MiB':>6} {'mode':9} {'recv':>4} {'seconds':>9} {'GB/s':>8} {'d2d GB/s':>9} {'x of 1':>7}")
one = {}
for r in rows:
    key = (r["path"], r["bytes"], r["mode"])
    if r["receivers"] == 1: one[key] = r["seconds"]
    ratio = r["seconds"] / one[key] if key in one else float("nan")
    print(f"{r['path']:10} {r['bytes'] >> 20:6} {r['mode']:9} {r['receivers']:4} {r['seconds']:9.5f} {r['gbps']:8.1f} {r['memcpy_gbps']:9.1f} {ratio:7.2f}")
PY
fi
exit $rc
