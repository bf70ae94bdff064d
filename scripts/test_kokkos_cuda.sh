#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# pmt built for Kokkos::Cuda as a CUDA user builds it: against a Kokkos with its CUDA backend
# (scripts/kokkos_cuda.sh: Kokkos 4.7.0 for sm_90, OpenMP on the host), through that Kokkos'
# nvcc_wrapper, with the host flags pmt's own programs get everywhere (-march=native included),
# warnings as errors on both sides (g++'s -Wall -Wextra -Wpedantic -Werror, nvcc's
# -Werror=all-warnings). Every test source, every example and cuda_step are compiled (host and
# device code) and linked, against the CUDA toolkit's driver stub; the BLAS is the main build's.
# Nothing runs here: that needs a GPU (cuda_step_np1 in build-cuda/ then runs cuda_step).
#
# In build-cuda/ (or $PMT_BUILD_CUDA_DIR). About 12 minutes on 2 cores. Called by scripts/test.sh
# after the other stages; PMT_KOKKOS_CUDA=off or a machine without nvcc skips it. Extra arguments
# go to the CMake configure step.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${PMT_BUILD_CUDA_DIR:-$root/build-cuda}
prefix=$("$root/scripts/kokkos_cuda.sh" | sed -n 's/^KOKKOS_CUDA_PREFIX=//p')
if [ -z "$prefix" ]; then
  echo "[pmt kokkos-cuda] no Kokkos::Cuda build (PMT_KOKKOS_CUDA=off or no nvcc)"
  exit 0
fi
blas=()
openblas=$("$root/scripts/openblas.sh" | sed -n 's/^OPENBLAS_PREFIX=//p')
if [ -n "$openblas" ]; then
  blas=(-DPMT_CBLAS_LIBRARIES_USER="$openblas/lib/libopenblas.so" -DPMT_CBLAS_INCLUDE_DIR="$openblas/include")
fi
start=$(date +%s)
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DPMT_WARNINGS_AS_ERRORS=ON \
  -DCMAKE_CXX_COMPILER="$prefix/bin/nvcc_wrapper" -DCMAKE_PREFIX_PATH="$prefix" "${blas[@]}" \
  -DPMT_ENABLE_BENCH=OFF "$@" >"$build.configure.log" 2>&1 \
  || { cat "$build.configure.log"; exit 1; }
grep -E "^-- pmt " "$build.configure.log" || true
grep -qE "^-- pmt .*\(.*CUDA.*\).*CUDA=TRUE, NCCL=TRUE" "$build.configure.log" \
  || { echo "[pmt kokkos-cuda] pmt did not take Kokkos' CUDA backend with CUDA and NCCL"; exit 1; }
cmake --build "$build" -j "$(nproc)"
[ -x "$build/tests/cuda_step" ] || { echo "[pmt kokkos-cuda] cuda_step was not built"; exit 1; }
echo "[pmt kokkos-cuda] every test, example and cuda_step compiled and linked for Kokkos::Cuda (sm_90)" \
     "in $(( $(date +%s) - start )) s"
