#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Configures pmt against Intel MKL's CBLAS instead of OpenBLAS and builds the given targets:
# MKL from its PyPI wheels (bench/fetch_mkl.sh: a pinned version, GNU OpenMP threading), passed
# through the same PMT_CBLAS_LIBRARIES_USER / PMT_CBLAS_INCLUDE_DIR options a user sets for any
# CBLAS. Build directory: build-mkl/ (or $PMT_BUILD_MKL_DIR). Used by scripts/test_mkl.sh (the
# tests) and bench/run.sh (bench_train_step, for bench/train_step.py's same-BLAS column).
# Usage: scripts/build_mkl.sh TARGET...
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${PMT_BUILD_MKL_DIR:-$root/build-mkl}
kokkos_prefix=$("$root/scripts/deps.sh" | sed -n 's/^KOKKOS_PREFIX=//p')
mkl_args=$("$root/bench/fetch_mkl.sh" --cmake)
# word splitting wanted: two -D arguments
# shellcheck disable=SC2086
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DPMT_WARNINGS_AS_ERRORS=ON \
  -DCMAKE_PREFIX_PATH="$kokkos_prefix" -DPMT_ENABLE_BENCH=ON -DPMT_ENABLE_EXAMPLES=OFF \
  $mkl_args >"$build.configure.log" 2>&1 \
  || { cat "$build.configure.log"; exit 1; }
grep -E "^-- pmt " "$build.configure.log" >&2 || true
grep -q "libmkl_core" "$build.configure.log" || { echo "[pmt mkl] CMake did not pick MKL's libraries" >&2; exit 1; }
cmake --build "$build" -j "$(nproc)" --target "$@"
