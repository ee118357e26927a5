#!/bin/bash
# Installs troupe from BUILD into a temporary prefix, then builds README's program with README's
# CMakeLists.txt (both taken verbatim from README.md, so the two cannot drift) against that prefix
# only, and again with pkg-config; each must print 42. The installed CLI runs, and each library
# has an SONAME. Usage: consume.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
src=$1
build=$2
work=$(mktemp -d "${TMPDIR:-/tmp}/troupe-consume.XXXXXX")
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix

cmake --install "$build" --prefix "$prefix" > "$work/install.log"

# Nothing of the source or build tree on any path: only the prefix.
"$(dirname "$0")/readme_program.sh" "$src" "$prefix" "$work/app"
"$(dirname "$0")/readme_program.sh" "$src" "$prefix" "$work/app-rl" consumer-rl   # troupe::rl

cxx=(g++)
if command -v ccache > /dev/null; then cxx=(ccache g++); fi
flags=$(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --cflags --libs troupe)
# shellcheck disable=SC2086
"${cxx[@]}" -std=c++20 -O1 "$work/app/main.cpp" -o "$work/app/hello_pc" $flags
out=$(TROUPE_TMPDIR="$work/sessions" "$work/app/hello_pc")
echo "pkg-config: $out"
[ "$out" = "42" ] || { echo "the pkg-config build printed '$out', not 42" >&2; exit 1; }
[ -x "$prefix/bin/troupe" ] || { echo "no troupe CLI in $prefix/bin" >&2; exit 1; }
"$prefix/bin/troupe" --help > /dev/null   # finds its libraries beside it ($ORIGIN/../lib)
for lib in base placement net transport control runtime; do   # shared, each with its SONAME
  soname=$(readelf -d "$prefix/lib/libtroupe_$lib.so" | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p')
  case "$soname" in libtroupe_$lib.so.[0-9]*) ;; *) echo "libtroupe_$lib.so has SONAME '$soname'" >&2; exit 1 ;; esac
done
echo "ok"
