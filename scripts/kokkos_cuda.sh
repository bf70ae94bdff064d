#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds a Kokkos with its CUDA backend into a cache prefix (~/.cache/pmt/kokkos-cuda-4.7.0):
# Kokkos_ENABLE_CUDA with Kokkos_ARCH_HOPPER90 (sm_90), OpenMP and Serial on the host, C++17,
# compiled by its own nvcc_wrapper. scripts/test_kokkos_cuda.sh builds pmt's tests, examples and
# cuda_step against it. No GPU is needed: programs link against the CUDA toolkit's driver stub.
#
# The source. Debian serves no Kokkos source newer than bookworm's trilinos (Kokkos 3.4, which
# cannot build its CUDA backend with CUDA 13). The Python package index does: the source
# distribution of pygenten 0.1.5 carries Kokkos 4.7.0 in tpls/kokkos. pip fetches it from the index
# this machine's pip is configured with, pinned by its SHA-256 (pip checks it), and only that folder
# is unpacked. scripts/kokkos-4.7.0-cuda13.patch adapts it to the CUDA 13 toolkit (two runtime
# calls whose signatures CUDA 13 changed, and nvcc_wrapper's default architecture).
#
# Idempotent: about 2 minutes on 2 cores the first time. Prints `KOKKOS_CUDA_PREFIX=<dir>` on its
# last line, empty where it builds nothing: PMT_KOKKOS_CUDA=off, or no nvcc on the PATH.
set -euo pipefail

log() { echo "[pmt kokkos-cuda] $*" >&2; }
if [ "${PMT_KOKKOS_CUDA:-on}" = off ]; then
  log "PMT_KOKKOS_CUDA=off: no Kokkos::Cuda build"
  echo "KOKKOS_CUDA_PREFIX="
  exit 0
fi
if ! command -v nvcc >/dev/null 2>&1; then
  log "no nvcc on the PATH: no Kokkos::Cuda build"
  echo "KOKKOS_CUDA_PREFIX="
  exit 0
fi
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${PMT_DEPS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pmt}
PREFIX="$CACHE/kokkos-cuda-4.7.0"
if [ -f "$PREFIX/.pmt-complete" ]; then
  echo "KOKKOS_CUDA_PREFIX=$PREFIX"
  exit 0
fi
command -v patch >/dev/null 2>&1 || { log "patch is not installed (scripts/deps.sh installs it)"; exit 1; }

log "building Kokkos 4.7.0 (CUDA for sm_90 + OpenMP + Serial) into $PREFIX"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "pygenten==0.1.5 --hash=sha256:e620f05c742905e2db705d875f1cac92ef0ed453f9e6734e9beda26cc0f9cce7" \
  >"$work/requirements.txt"
python3 -m pip download --quiet --no-deps --no-binary :all: --require-hashes -r "$work/requirements.txt" \
  -d "$work" >"$work/pip.log" 2>&1 || { cat "$work/pip.log" >&2; exit 1; }
tar -xzf "$work"/pygenten-0.1.5.tar.gz -C "$work" pygenten-0.1.5/tpls/kokkos
src="$work/pygenten-0.1.5/tpls/kokkos"
grep -q 'set(Kokkos_VERSION_MINOR 7)' "$src/CMakeLists.txt" || { log "$src is not Kokkos 4.7"; exit 1; }
(cd "$src" && patch -p1 --quiet <"$here/kokkos-4.7.0-cuda13.patch")
# Kokkos records the compiler it was configured with: its installed nvcc_wrapper, not the
# temporary source tree's
rm -rf "$PREFIX" && mkdir -p "$PREFIX/bin"
cp "$src/bin/nvcc_wrapper" "$PREFIX/bin/nvcc_wrapper"
cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$PREFIX" \
  -DCMAKE_CXX_COMPILER="$PREFIX/bin/nvcc_wrapper" -DCMAKE_CXX_STANDARD=17 -DCMAKE_CXX_EXTENSIONS=OFF \
  -DKokkos_ENABLE_CUDA=ON -DKokkos_ARCH_HOPPER90=ON -DKokkos_ENABLE_OPENMP=ON -DKokkos_ENABLE_SERIAL=ON \
  -DKokkos_ENABLE_TESTS=OFF -DKokkos_ENABLE_EXAMPLES=OFF >"$work/configure.log" 2>&1 \
  || { cat "$work/configure.log" >&2; exit 1; }
cmake --build "$work/build" -j "$(nproc)" >"$work/build.log" 2>&1 || { tail -n 50 "$work/build.log" >&2; exit 1; }
cmake --install "$work/build" >/dev/null
touch "$PREFIX/.pmt-complete"
log "Kokkos installed in $PREFIX"
echo "KOKKOS_CUDA_PREFIX=$PREFIX"
