#!/bin/bash
# README's program, as a user builds it: the CMakeLists.txt and main.cpp blocks after the
# "<!-- MARKER: NAME -->" markers of README.md (verbatim, so the two cannot drift), configured
# with CMAKE_PREFIX_PATH=PREFIX only, built and run in APP_DIR; it must print 42. MARKER is
# "consumer" (the runtime's program, hello_troupe) or "consumer-rl" (the RL one, rl_troupe).
# Usage: readme_program.sh SOURCE_DIR PREFIX APP_DIR [MARKER]. Leaves APP_DIR/main.cpp for other builds.
set -euo pipefail
src=$1
prefix=$2
app=$3
marker=${4:-consumer}
program=hello_troupe
[ "$marker" = consumer-rl ] && program=rl_troupe
mkdir -p "$app"
for name in CMakeLists.txt main.cpp; do
  awk -v marker="<!-- $marker: $name -->" '
    $0 == marker { found = 1; next }
    found && /^```/ { if (inside) exit; inside = 1; next }
    inside { print }
  ' "$src/README.md" > "$app/$name"
  [ -s "$app/$name" ] || { echo "README.md has no '$name' block" >&2; exit 1; }
done
launcher=()
if command -v ccache > /dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
cmake -S "$app" -B "$app/build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" \
      "${launcher[@]}" > "$app/configure.log" || { cat "$app/configure.log"; exit 1; }
cmake --build "$app/build" -j2 > "$app/build.log" || { cat "$app/build.log"; exit 1; }
out=$(TROUPE_TMPDIR="$app/sessions" "$app/build/$program")   # the embedded cluster's session
echo "README's program against $prefix: $out"
[ "$out" = "42" ] || { echo "README's program printed '$out', not 42" >&2; exit 1; }
