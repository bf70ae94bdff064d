#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds an OpenBLAS that knows current x86-64 CPUs into a cache prefix, from the source package
# of Debian's next release (trixie: OpenBLAS 0.3.29), and prints `OPENBLAS_PREFIX=<dir>` on its
# last line (empty where none is used). scripts/build.sh links it instead of the system's.
#
# Why: Debian 12's OpenBLAS 0.3.21 chooses its kernels by CPU model and falls back to its generic
# 'Prescott' kernels on a model it does not list (reported on Sapphire Rapids Xeons: 3-5x
# slower), and runs its AVX2 'Zen' kernels on AVX-512 Zen 4 EPYCs. 0.3.29 knows these models,
# and on a model it does not list it takes the kernels of the widest vector ISA the CPU reports
# (AVX512-BF16, AVX-512, AVX2, AVX) instead of the generic ones.
#
# The build: run-time kernel selection (DYNAMIC_ARCH) over the x86-64 kernel sets of the last
# decade (Haswell, Zen, SkylakeX, Cooperlake, Sapphire Rapids; Prescott as the fallback), threaded
# with OpenMP (libgomp: the pool Kokkos' OpenMP space uses, like Debian's libopenblas-openmp),
# CBLAS only (no Fortran, no LAPACK). About 10 minutes on 2 cores, once per cache.
#
# PMT_OPENBLAS=system skips it (the system's OpenBLAS is used); so does any CPU that is not x86-64.
# The source comes through the archive this machine's apt configuration names
# (scripts/debian_mirror.sh) with a private package list: the machine's own apt sources are not
# touched. Idempotent.
set -euo pipefail

log() { echo "[pmt openblas] $*" >&2; }
suite=trixie
if [ "${PMT_OPENBLAS:-build}" = system ]; then
  log "PMT_OPENBLAS=system: the system's OpenBLAS is used"
  echo "OPENBLAS_PREFIX="
  exit 0
fi
if [ "$(uname -m)" != x86_64 ]; then
  log "not an x86-64 CPU: the system's OpenBLAS is used"
  echo "OPENBLAS_PREFIX="
  exit 0
fi
CACHE=${PMT_DEPS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pmt}
PREFIX="$CACHE/openblas-$suite"
if [ -f "$PREFIX/.pmt-complete" ]; then
  echo "OPENBLAS_PREFIX=$PREFIX"
  exit 0
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/cache/archives/partial"
mirror=$("$(dirname "${BASH_SOURCE[0]}")/debian_mirror.sh")
key=${mirror#* }
echo "deb-src [${key:+signed-by=$key}] ${mirror% *} $suite main" | sed 's/\[signed-by=-\] //; s/\[\] //' >"$work/sources.list"
apt_opts=(-o Dir::Etc::SourceList="$work/sources.list" -o Dir::Etc::SourceParts=/dev/null
          -o Dir::State::Lists="$work/lists" -o Dir::Cache="$work/cache" -o APT::Sandbox::User=root)
apt-get "${apt_opts[@]}" update -qq >"$work/update.log" 2>&1 || { cat "$work/update.log" >&2; exit 1; }
(cd "$work" && apt-get "${apt_opts[@]}" source --download-only -qq openblas >download.log 2>&1) \
  || { cat "$work/download.log" >&2; exit 1; }
tarball=$(ls "$work"/openblas_*.orig.tar.*)
version=$(basename "$tarball" | sed 's/^openblas_\([0-9.]*\).*/\1/')
log "building OpenBLAS $version (Debian $suite's source) into $PREFIX: about 10 minutes on 2 cores, once"
tar -xf "$tarball" -C "$work"
src=$(ls -d "$work"/OpenBLAS-*/)
opts=(DYNAMIC_ARCH=1 "DYNAMIC_LIST=HASWELL ZEN SKYLAKEX COOPERLAKE SAPPHIRERAPIDS" USE_OPENMP=1
      NUM_THREADS=256 NO_LAPACK=1 NO_FORTRAN=1 ONLY_CBLAS=1 NO_STATIC=1 BUILD_SINGLE=1 BUILD_DOUBLE=1
      BUILD_BFLOAT16=1 NO_WARMUP=1)
make -C "$src" -j "$(nproc)" "${opts[@]}" libs shared >"$work/build.log" 2>&1 \
  || { tail -n 40 "$work/build.log" >&2; exit 1; }
rm -rf "$PREFIX"
make -C "$src" "${opts[@]}" PREFIX="$PREFIX" install >"$work/install.log" 2>&1 \
  || { tail -n 40 "$work/install.log" >&2; exit 1; }
[ -e "$PREFIX/lib/libopenblas.so" ] && [ -f "$PREFIX/include/cblas.h" ] \
  || { log "the install holds no lib/libopenblas.so or include/cblas.h"; exit 1; }
echo "$version" >"$PREFIX/version"
touch "$PREFIX/.pmt-complete"
log "OpenBLAS $version in $PREFIX"
echo "OPENBLAS_PREFIX=$PREFIX"
