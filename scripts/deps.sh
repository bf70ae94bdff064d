#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs everything pmt's build, tests, examples and benchmarks need on Debian 12 (bookworm):
#   - apt: g++, cmake, Open MPI, OpenBLAS (CBLAS; the OpenMP-threaded build too), Catch2 v3
#     (from bookworm-backports), clang-format (the suite's format stage), Random123 (the
#     reference test_random checks pmt's Philox against), CLI11 and nlohmann-json (the programs'
#     flags and JSON: pmt/run/ and the examples; the library's other headers need neither)
#   - Kokkos 3.4.01 with OpenMP + Serial, built from Debian's trilinos source package into a cache
#     prefix (default ~/.cache/pmt/kokkos-3.4.01), unless Kokkos_ROOT points at a Kokkos already.
#     PMT_KOKKOS_CHECKED=1 builds it with Kokkos' debug checks and View bounds checking instead,
#     into kokkos-3.4.01-checked (for scripts/check.sh).
# Idempotent and quiet when everything is present. Prints the Kokkos prefix on its last line
# (`KOKKOS_PREFIX=...`) so callers can pass it to CMake.
set -euo pipefail

log() { echo "[pmt deps] $*" >&2; }
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

# ---------------------------------------------------------------------------------------------
# apt packages
APT_PKGS=(g++ make cmake pkg-config patch clang-format librandom123-dev libcli11-dev nlohmann-json3-dev openmpi-bin libopenmpi-dev libopenblas-dev libopenblas-openmp-dev dpkg-dev xz-utils unzip python3-pip
          iproute2 util-linux)  # ip, unshare, taskset: the tests' two emulated nodes (scripts/two_nodes.sh)
need=()
for p in "${APT_PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
catch2_ok=0
if dpkg-query -W -f='${Status} ${Version}' libcatch2-dev 2>/dev/null | grep -q "install ok installed 3\."; then
  catch2_ok=1
fi

backports_src=/etc/apt/sources.list.d/pmt-bookworm-backports.sources
debsrc_src=/etc/apt/sources.list.d/pmt-bookworm-src.sources
add_sources() {
  # the release's own archive, as this machine's apt configuration names it (scripts/debian_mirror.sh)
  local mirror uri key
  mirror=$("$(dirname "${BASH_SOURCE[0]}")/debian_mirror.sh")
  uri=${mirror% *}
  key=${mirror#* }
  local signed=""
  [ "$key" = "-" ] || signed="Signed-By: $key"
  if [ ! -f "$backports_src" ]; then
    log "adding bookworm-backports (for Catch2 v3) from $uri"
    printf 'Types: deb\nURIs: %s\nSuites: bookworm-backports\nComponents: main\n%s\n' "$uri" "$signed" \
      | $SUDO tee "$backports_src" >/dev/null
    APT_UPDATED=0
  fi
  if [ ! -f "$debsrc_src" ]; then
    log "adding deb-src for bookworm (Kokkos comes from the trilinos source package) from $uri"
    printf 'Types: deb-src\nURIs: %s\nSuites: bookworm\nComponents: main\n%s\n' "$uri" "$signed" \
      | $SUDO tee "$debsrc_src" >/dev/null
    APT_UPDATED=0
  fi
}
APT_UPDATED=${APT_UPDATED:-0}
apt_update() {
  if [ "$APT_UPDATED" = 0 ]; then
    log "apt-get update"
    $SUDO apt-get update -qq >/dev/null
    APT_UPDATED=1
  fi
}

if [ ${#need[@]} -gt 0 ] || [ $catch2_ok = 0 ]; then
  add_sources
  apt_update
  if [ ${#need[@]} -gt 0 ]; then
    log "installing: ${need[*]}"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  fi
  if [ $catch2_ok = 0 ]; then
    log "installing Catch2 v3 from bookworm-backports"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
      -t bookworm-backports libcatch2-dev >/dev/null
  fi
fi

# ---------------------------------------------------------------------------------------------
# Kokkos (OpenMP + Serial)
if [ -n "${Kokkos_ROOT:-}" ]; then
  if ls "$Kokkos_ROOT"/lib*/cmake/Kokkos/KokkosConfig.cmake >/dev/null 2>&1; then
    echo "KOKKOS_PREFIX=$Kokkos_ROOT"
    exit 0
  fi
  log "Kokkos_ROOT=$Kokkos_ROOT holds no lib*/cmake/Kokkos/KokkosConfig.cmake"; exit 1
fi
CACHE=${PMT_DEPS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pmt}
PREFIX="$CACHE/kokkos-3.4.01"
variant="OpenMP + Serial"
extra=()
if [ "${PMT_KOKKOS_CHECKED:-0}" = 1 ]; then
  PREFIX="$PREFIX-checked"
  variant="OpenMP + Serial, debug checks and View bounds checking"
  extra=(-DKokkos_ENABLE_DEBUG=ON -DKokkos_ENABLE_DEBUG_BOUNDS_CHECK=ON)
fi
if [ -f "$PREFIX/.pmt-complete" ]; then
  echo "KOKKOS_PREFIX=$PREFIX"
  exit 0
fi

log "building Kokkos 3.4.01 ($variant) from Debian's trilinos source into $PREFIX"
add_sources
apt_update
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(
  cd "$work"
  apt-get source --download-only -qq trilinos >/dev/null 2>&1
  tarball=$(ls trilinos_*.orig.tar.*)
  tar -xf "$tarball" --wildcards '*/packages/kokkos/*'
  mv ./*/packages/kokkos kokkos-src
)
cmake -S "$work/kokkos-src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_INSTALL_PREFIX="$PREFIX" -DCMAKE_CXX_STANDARD=17 -DCMAKE_CXX_EXTENSIONS=OFF \
  -DKokkos_ENABLE_OPENMP=ON -DKokkos_ENABLE_SERIAL=ON -DBUILD_SHARED_LIBS=ON \
  -DKokkos_ENABLE_TESTS=OFF -DKokkos_ENABLE_EXAMPLES=OFF "${extra[@]}" >"$work/configure.log" 2>&1 \
  || { cat "$work/configure.log" >&2; exit 1; }
cmake --build "$work/build" -j "$(nproc)" >"$work/build.log" 2>&1 || { tail -n 50 "$work/build.log" >&2; exit 1; }
cmake --install "$work/build" >/dev/null
touch "$PREFIX/.pmt-complete"
log "Kokkos installed in $PREFIX"
echo "KOKKOS_PREFIX=$PREFIX"
