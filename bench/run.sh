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
if [ -x "${PMT_TORCH_PYTHON:-}" ] || python3 -c "import torch" 2>/dev/null; then
  python3 "$root/bench/train_step.py" "$build" "${PMT_TORCH_PYTHON:-python3}"
else
  echo "bench/train_step.py: PyTorch not found (set PMT_TORCH_PYTHON to a python with torch); running pmt alone"
  python3 "$root/bench/train_step.py" "$build"
fi
echo
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
for np in 2 4; do
  # no OpenMP binding here: it would pin every rank's thread to the same core
  OMP_NUM_THREADS=1 OMP_PROC_BIND=false OMP_PLACES= mpiexec -n "$np" --oversubscribe --bind-to none "$build/bench/bench_allreduce"
  echo
done
