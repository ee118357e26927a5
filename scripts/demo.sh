#!/usr/bin/env bash
# Runs the README's main job from build dir $1. The demo target decides which example it is.
set -euo pipefail
build=${1:-build}
exec "$build/bin/$(cat "$build/demo_program")"
