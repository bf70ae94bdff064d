#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs the dependencies (scripts/deps.sh, and on x86-64 an OpenBLAS that knows current CPUs:
# scripts/openblas.sh), then configures and builds pmt in build/ (or $PMT_BUILD_DIR) with warnings
# as errors. Extra arguments go to the CMake configure step (a PMT_CBLAS_LIBRARIES_USER given there
# takes the place of that OpenBLAS).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${PMT_BUILD_DIR:-$root/build}
kokkos_prefix=$("$root/scripts/deps.sh" | sed -n 's/^KOKKOS_PREFIX=//p')
# the BLAS: the OpenBLAS of scripts/openblas.sh where it builds one (PMT_OPENBLAS=system: Debian's)
blas=()
openblas=$("$root/scripts/openblas.sh" | sed -n 's/^OPENBLAS_PREFIX=//p')
if [ -n "$openblas" ]; then
  blas=(-DPMT_CBLAS_LIBRARIES_USER="$openblas/lib/libopenblas.so" -DPMT_CBLAS_INCLUDE_DIR="$openblas/include")
else
  blas=(-UPMT_CBLAS_LIBRARIES_USER -UPMT_CBLAS_INCLUDE_DIR)
fi
# pmt takes CUDA only with a CUDA Kokkos by default; the suite asks for it wherever a toolkit is
# installed, to compile the host-side cuBLAS and NCCL code (Kokkos::Cuda: scripts/test_kokkos_cuda.sh)
cuda=()
if command -v nvcc >/dev/null 2>&1; then cuda=(-DPMT_ENABLE_CUDA=ON); fi
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DPMT_WARNINGS_AS_ERRORS=ON "${cuda[@]}" "${blas[@]}" \
  -DCMAKE_PREFIX_PATH="$kokkos_prefix" "$@" >"$build.configure.log" 2>&1 \
  || { cat "$build.configure.log"; exit 1; }
grep -E "^-- pmt " "$build.configure.log" || true
cmake --build "$build" -j "$(nproc)"
