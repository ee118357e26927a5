#!/usr/bin/env bash
# Runs every benchmark in $1/bench; each prints one JSON object on its last line.
set -euo pipefail
build=${1:-build}
for b in "$build"/bench/*; do
  [[ -x "$b" && -f "$b" ]] || continue
  echo "== $(basename "$b")"
  "$b"
done
