#!/bin/bash
# Builds the Debian packages (CPack), checks their Depends with dpkg-deb -f, extracts them with
# dpkg-deb -x into a temporary root, and builds and runs README's program against that root only
# (nothing of the source or build tree on any path). Usage: deb.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
src=$1
build=$2
work=$(mktemp -d "${TMPDIR:-/tmp}/troupe-deb.XXXXXX")
trap 'rm -rf "$work"' EXIT

(cd "$build" && cpack --config CPackConfig.cmake -B "$work/packages" > "$work/cpack.log") ||
  { cat "$work/cpack.log"; exit 1; }
runtime_deb=$(ls "$work"/packages/troupe_*.deb)
dev_deb=$(ls "$work"/packages/libtroupe-dev_*.deb)
rl_deb=$(ls "$work"/packages/libtroupe-rl-dev_*.deb)

# troupe: Depends computed from its shared libraries (dpkg-shlibdeps), so the libraries it links
# are named there; libtroupe-dev: troupe at the same version and the -dev packages a program needs.
runtime_depends=$(dpkg-deb -f "$runtime_deb" Depends)
dev_depends=$(dpkg-deb -f "$dev_deb" Depends)
echo "troupe Depends: $runtime_depends"
echo "libtroupe-dev Depends: $dev_depends"
for pkg in libcaf-core0.17 libucx0 libsqlite3-0 libssl3 libarchive13 libelf1 libspdlog1.10 libc6 libstdc++6; do
  grep -q "\b$pkg\b" <<< "$runtime_depends" || { echo "troupe does not depend on $pkg" >&2; exit 1; }
done
version=$(dpkg-deb -f "$runtime_deb" Version)
for dep in "troupe (= $version)" libcaf-dev libucx-dev libmsgpack-cxx-dev libspdlog-dev; do
  grep -qF "$dep" <<< "$dev_depends" || { echo "libtroupe-dev does not depend on $dep" >&2; exit 1; }
done
dpkg-deb -c "$runtime_deb" | grep -q '/usr/include/' && { echo "headers in the runtime package" >&2; exit 1; }
rl_depends=$(dpkg-deb -f "$rl_deb" Depends)
echo "libtroupe-rl-dev Depends: $rl_depends"
for dep in "libtroupe-dev (= $version)" libtorch-dev libtomlplusplus-dev; do
  grep -qF "$dep" <<< "$rl_depends" || { echo "libtroupe-rl-dev does not depend on $dep" >&2; exit 1; }
done
rl_files=$(dpkg-deb -c "$rl_deb")   # listed whole first: grep -q would close the pipe early
dev_files=$(dpkg-deb -c "$dev_deb")
grep -q 'troupeRlTargets.cmake' <<< "$rl_files" || { echo "no troupe::rl targets in libtroupe-rl-dev" >&2; exit 1; }
grep -q 'libtroupe_rl' <<< "$dev_files" && { echo "the RL library in libtroupe-dev" >&2; exit 1; }

root=$work/root
dpkg-deb -x "$runtime_deb" "$root"
dpkg-deb -x "$dev_deb" "$root"
dpkg-deb -x "$rl_deb" "$root"
"$root/usr/bin/troupe" --help > /dev/null

"$(dirname "$0")/readme_program.sh" "$src" "$root/usr" "$work/app"   # that root only
"$(dirname "$0")/readme_program.sh" "$src" "$root/usr" "$work/app-rl" consumer-rl
echo "ok"
