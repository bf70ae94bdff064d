#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Fetches the newest Kokkos Debian packages (libkokkos-dev and its library from Debian unstable:
# Kokkos 5.x, OpenMP configuration, C++20) into a cache, for scripts/test_kokkos_next.sh, which
# builds pmt's tests against this Kokkos and runs them. Its library needs a newer glibc and
# libstdc++ than Debian 12's, so the C and C++ runtime libraries of the same release (libc6 with
# its loader, libstdc++6, libgcc-s1, libgomp1) are unpacked beside it, and the test programs name
# that loader as their interpreter. Nothing is installed into the system: the machine keeps its
# own C library.
#
# apt-get downloads the packages by name with a private package list (the machine's own apt
# sources are not touched). Idempotent. Prints `KOKKOS_NEXT_INCLUDE=<dir>` and
# `KOKKOS_NEXT_ROOT=<dir>` (the unpacked tree: usr/lib/x86_64-linux-gnu, usr/lib64's loader, and
# cmake/Kokkos, Kokkos' CMake package relocated to that tree) on its last two lines.
# PMT_KOKKOS_NEXT=off skips it (prints empty directories: the checks are then not run).
set -euo pipefail

log() { echo "[pmt kokkos-next] $*" >&2; }
if [ "${PMT_KOKKOS_NEXT:-on}" = off ]; then
  log "PMT_KOKKOS_NEXT=off: no Kokkos-next checks"
  echo "KOKKOS_NEXT_INCLUDE="
  echo "KOKKOS_NEXT_ROOT="
  exit 0
fi
CACHE=${PMT_DEPS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pmt}
DIR="$CACHE/kokkos-next"
if [ -f "$DIR/.pmt-complete-runtime" ]; then
  echo "KOKKOS_NEXT_INCLUDE=$DIR/include"
  echo "KOKKOS_NEXT_ROOT=$DIR/root"
  exit 0
fi

log "fetching libkokkos-dev from Debian unstable into $DIR"
apt_dir=$(mktemp -d)
trap 'rm -rf "$apt_dir"' EXIT
mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial"
# unstable from the archive this machine's apt configuration names (scripts/debian_mirror.sh)
mirror=$("$(dirname "${BASH_SOURCE[0]}")/debian_mirror.sh")
key=${mirror#* }
echo "deb [${key:+signed-by=$key}] ${mirror% *} sid main" | sed 's/\[signed-by=-\] //; s/\[\] //' >"$apt_dir/sources.list"
apt_opts=(-o Dir::Etc::SourceList="$apt_dir/sources.list" -o Dir::Etc::SourceParts=/dev/null
          -o Dir::State::Lists="$apt_dir/lists" -o Dir::Cache="$apt_dir/cache" -o APT::Architectures::=amd64
          -o APT::Sandbox::User=root)
apt-get "${apt_opts[@]}" update -qq >"$apt_dir/update.log" 2>&1 || { cat "$apt_dir/update.log" >&2; exit 1; }
(cd "$apt_dir" && apt-get "${apt_opts[@]}" download -qq libkokkos-dev >download.log 2>&1) \
  || { cat "$apt_dir/download.log" >&2; exit 1; }
# the library package libkokkos-dev depends on (libkokkos5.2 for 5.2.x), and the runtimes it needs
lib_pkg=$(dpkg-deb -f "$apt_dir"/libkokkos-dev_*.deb Depends | tr ',' '\n' | sed -n 's/^ *\(libkokkos[0-9][0-9.]*\) .*/\1/p' | head -1)
[ -n "$lib_pkg" ] || { log "libkokkos-dev names no libkokkos library package"; exit 1; }
(cd "$apt_dir" && apt-get "${apt_opts[@]}" download -qq "$lib_pkg" libc6 libstdc++6 libgcc-s1 libgomp1 >>download.log 2>&1) \
  || { cat "$apt_dir/download.log" >&2; exit 1; }
rm -rf "$DIR" && mkdir -p "$DIR/root"
for deb in "$apt_dir"/*.deb; do dpkg-deb -x "$deb" "$DIR/root"; done
[ -f "$DIR/root/usr/include/kokkos/Kokkos_Core.hpp" ] || { log "libkokkos-dev holds no Kokkos_Core.hpp"; exit 1; }
lib="$DIR/root/usr/lib/x86_64-linux-gnu"
[ -e "$lib/libkokkoscore.so" ] && [ -e "$DIR/root/usr/lib64/ld-linux-x86-64.so.2" ] && [ -e "$lib/libstdc++.so.6" ] \
  || { log "the unpacked packages lack libkokkoscore.so, the loader or libstdc++"; exit 1; }
# Kokkos' CMake package names /usr/include/kokkos and /usr/lib/... absolutely: point them here
mkdir -p "$DIR/root/cmake/Kokkos"
for f in "$lib"/cmake/Kokkos/*.cmake; do
  sed -e "s#\"/usr/include/#\"$DIR/root/usr/include/#g" -e "s#\"/usr/lib/#\"$DIR/root/usr/lib/#g" \
      -e "s#\\\${_IMPORT_PREFIX}#$DIR/root/usr#g" "$f" >"$DIR/root/cmake/Kokkos/$(basename "$f")"
done
# The package's CMake targets name libkokkosalgorithms.a and libkokkossimd.a, which it does not ship
# (5.2.2-2); both hold only a placeholder object upstream (these parts of Kokkos are header-only).
# Empty archives stand in, so that find_package(Kokkos) succeeds; a symbol really missing would
# still fail the link.
for a in $(sed -n 's#.*IMPORTED_LOCATION_[A-Z]* "\([^"]*\.a\)".*#\1#p' "$DIR/root/cmake/Kokkos/"KokkosTargets-*.cmake); do
  [ -e "$a" ] || { ar rc "$a" && log "$(basename "$a") is missing from the package: an empty archive stands in"; }
done
ln -s root/usr/include/kokkos "$DIR/include"
(cd "$apt_dir" && ls *.deb) >"$DIR/package"
touch "$DIR/.pmt-complete-runtime"
log "Kokkos $(sed -n 's/^#define KOKKOS_VERSION \([0-9]*\)$/\1/p' "$DIR/include/KokkosCore_config.h") in $DIR ($(tr '\n' ' ' <"$DIR/package"))"
echo "KOKKOS_NEXT_INCLUDE=$DIR/include"
echo "KOKKOS_NEXT_ROOT=$DIR/root"
