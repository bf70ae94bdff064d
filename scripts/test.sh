#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The whole test suite: dependencies, build (warnings as errors), then every test under ctest,
# multi-rank tests at np = 1, 2, 4 (oversubscribed), the header self-containment build, the
# compile-fail tests and the find_package(pmt) consumer against the installed tree; the tree's
# formatting against .clang-format (scripts/format.sh); then the same tests built against Kokkos 5
# and run (scripts/test_kokkos_next.sh; PMT_KOKKOS_NEXT=off skips it), the BLAS-bound tests built
# against Intel MKL instead of OpenBLAS (scripts/test_mkl.sh; PMT_MKL=off skips it), and, where
# nvcc is installed, every test, example and cuda_step compiled and linked for Kokkos::Cuda with a
# CUDA-enabled Kokkos (scripts/test_kokkos_cuda.sh; PMT_KOKKOS_CUDA=off skips it).
# Each stage's wall time is printed at the end.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${PMT_BUILD_DIR:-$root/build}
times=()
stage() {  # stage NAME COMMAND...: runs it, records its wall time
  local name=$1 t0=$SECONDS
  shift
  echo "[pmt test] stage $name"
  "$@"
  times+=("$(printf '%-14s %5d s' "$name" $((SECONDS - t0)))")
}
report() {
  echo "[pmt test] stage times:"
  printf '  %s\n' "${times[@]}"
}
trap report EXIT
stage build "$root/scripts/build.sh" "$@"
stage ctest bash -c "cd '$build' && ctest --output-on-failure -j $(nproc) --timeout 900"
stage format "$root/scripts/format.sh"
stage kokkos-next "$root/scripts/test_kokkos_next.sh"
stage mkl "$root/scripts/test_mkl.sh"
stage kokkos-cuda "$root/scripts/test_kokkos_cuda.sh"
