#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds pmt (scripts/build.sh), fetches MKL's libraries for the side-by-side column, and runs the
# benchmarks with 2 OpenMP threads bound to cores. Output: the tables and the `target` lines.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/scripts/build.sh" >/dev/null
build=${PMT_BUILD_DIR:-$root/build}
export PMT_MKL_LIB=${PMT_MKL_LIB:-$("$root/bench/fetch_mkl.sh" 2>/dev/null || echo "")}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)} OMP_PROC_BIND=spread OMP_PLACES=threads
"$build/bench/bench_matmul" "${PMT_BENCH_REPS_MATMUL:-15}"
echo
"$build/bench/bench_ops" "${PMT_BENCH_REPS:-10}"
echo
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
for np in 2 4; do
  OMP_NUM_THREADS=1 mpiexec -n "$np" --oversubscribe --bind-to none "$build/bench/bench_allreduce"
  echo
done
