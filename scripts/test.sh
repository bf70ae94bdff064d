#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The whole test suite: dependencies, build (warnings as errors), then every test under ctest,
# multi-rank tests at np = 1, 2, 4 (oversubscribed), the header self-containment build, the
# compile-fail tests and the find_package(pmt) consumer against the installed tree; then the same
# tests built against Kokkos 5 and run (scripts/test_kokkos_next.sh; PMT_KOKKOS_NEXT=off skips it),
# the BLAS-bound tests built against Intel MKL instead of OpenBLAS (scripts/test_mkl.sh;
# PMT_MKL=off skips it), and, where nvcc is installed, every test, example and cuda_step compiled
# and linked for Kokkos::Cuda with a CUDA-enabled Kokkos (scripts/test_kokkos_cuda.sh;
# PMT_KOKKOS_CUDA=off skips it).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/scripts/build.sh" "$@"
build=${PMT_BUILD_DIR:-$root/build}
(cd "$build" && ctest --output-on-failure -j "$(nproc)" --timeout 900)
"$root/scripts/test_kokkos_next.sh"
"$root/scripts/test_mkl.sh"
"$root/scripts/test_kokkos_cuda.sh"
