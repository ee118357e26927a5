#!/usr/bin/env bash
# Builds the CUDA kernels of kernels/ on a GPU machine with nvcc alone (no CMake packages, no
# network), checks each against its CPU twin, times it against the HBM bandwidth floor (bytes it
# must move / device-to-device copy bandwidth measured in the same run) and against torch eager
# when python3 can import torch with CUDA. Runs from the repository root in well under 5 minutes.
# Prints a table last. Exit status: 0 when every check passes, 1 when one fails, 2 on no device.
set -euo pipefail
cd "$(dirname "$0")/../.."
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
ARCH=${ARCH:-sm_90}
BUILD=${BUILD:-${TMPDIR:-/tmp}/troupe-kernels-device}
JOBS=${JOBS:-$(nproc)}
OUTDIR=${OUT:-$BUILD}
mkdir -p "$BUILD" "$OUTDIR"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv,noheader || true

echo "== build ($ARCH) in $BUILD"
t0=$(date +%s)
common=(-std=c++20 -O3 -DNDEBUG -Ibase/include -Ikernels/include -Ikernels/src)
objs=()
compile() {  # compile <src> <obj>: g++ for .cpp, nvcc for .cu
  if [[ $1 == *.cu ]]; then
    "$NVCC" "${common[@]}" -arch="$ARCH" --expt-relaxed-constexpr -DTROUPE_HAVE_CUDA=1 -c "$1" -o "$2"
  else
    g++ "${common[@]}" -fopenmp-simd -fno-trapping-math -c "$1" -o "$2"
  fi
}
for src in base/src/error.cpp kernels/cpu/*.cpp kernels/cuda/*.cu bench/device/kernels_check.cu; do
  [[ $src == */cuda_unavailable.cpp ]] && continue
  obj="$BUILD/$(basename "$src").o"
  objs+=("$obj")
  rm -f "$obj"
  while (( $(jobs -rp | wc -l) >= JOBS )); do wait -n || true; done
  compile "$src" "$obj" &
done
wait
for obj in "${objs[@]}"; do [[ -f $obj ]] || { echo "compile failed: $obj"; exit 3; }; done
"$NVCC" -arch="$ARCH" "${objs[@]}" -o "$BUILD/kernels_check" -lpthread
echo "built in $(( $(date +%s) - t0 )) s"

echo "== check against the CPU twins and time (cudaEvent, mean of 20 after 3 warm-ups)"
set +e
"$BUILD/kernels_check" "$OUTDIR/kernels_cuda.json"
check_rc=$?
set -e
[[ $check_rc -eq 2 ]] && exit 2

echo "== torch eager (same sizes)"
timeout 150 python3 bench/device/kernels_torch.py "$OUTDIR/kernels_torch.json" || echo "torch eager timing skipped"

python3 - "$OUTDIR/kernels_cuda.json" "$OUTDIR/kernels_torch.json" <<'PY'
import json, os, sys
cuda = json.load(open(sys.argv[1]))
torch = json.load(open(sys.argv[2])) if os.path.exists(sys.argv[2]) else {}
print(f"\n{cuda['device']}: copy bandwidth {cuda['copy_gbps']:.0f} GB/s (target: within 1.3x of the floor)")
print(f"{'kernel':22} {'check':5} {'us':>9} {'floor us':>9} {'x floor':>8} {'torch us':>9} {'speedup':>8}")
for name, k in cuda["kernels"].items():
    t = torch.get(name)
    ts = f"{t:9.1f}" if t else f"{'-':>9}"
    sp = f"{t / k['us']:7.2f}x" if t else f"{'-':>8}"
    print(f"{name:22} {'ok' if k['ok'] else 'FAIL':5} {k['us']:9.1f} {k['floor_us']:9.1f} {k['us'] / k['floor_us']:7.2f}x {ts} {sp}")
PY
exit $check_rc
