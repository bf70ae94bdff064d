#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds pmt (scripts/build.sh) and, against MKL, its training step (scripts/build_mkl.sh), fetches
# MKL's libraries for bench_matmul's side-by-side column, and runs the
# benchmarks with 2 OpenMP threads bound to cores. Output: the tables and the `target` lines.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/scripts/build.sh" >/dev/null
build=${PMT_BUILD_DIR:-$root/build}
export PMT_MKL_LIB=${PMT_MKL_LIB:-$("$root/bench/fetch_mkl.sh" 2>/dev/null || echo "")}
# pmt's training step built against MKL too (PyTorch's CPU BLAS), for train_step.py's same-BLAS rows
if [ -z "${PMT_MKL_BUILD:-}" ] && "$root/scripts/build_mkl.sh" bench_train_step >/dev/null 2>&1; then
  export PMT_MKL_BUILD=${PMT_BUILD_MKL_DIR:-$root/build-mkl}
fi
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
  env -u OMP_PLACES OMP_NUM_THREADS=1 OMP_PROC_BIND=false mpiexec -n "$np" --oversubscribe --bind-to none "$build/bench/bench_allreduce"
  echo
done
# Pipeline bubble and activation memory: sleeping stages on 2 and 4 ranks (the runtime without CPU
# contention), the real Gpt on 2 ranks (one core each on this 2-core machine). The ranks are
# bound round-robin to the cores: unbound, the kernel now and then ran both ranks of a tight
# schedule on one vCPU for a time slice (a 3-10 ms stall in a 30 ms bubble; docs/benchmarks.md).
for np in 2 4; do
  env -u OMP_PLACES OMP_NUM_THREADS=1 OMP_PROC_BIND=false mpiexec -n "$np" --oversubscribe --map-by core --bind-to core:overload-allowed "$build/bench/bench_pipeline" sleep "${PMT_BENCH_REPS_PIPELINE:-5}"
  echo
done
env -u OMP_PLACES OMP_NUM_THREADS=1 OMP_PROC_BIND=false mpiexec -n 2 --map-by core --bind-to core "$build/bench/bench_pipeline" model "${PMT_BENCH_REPS_PIPELINE:-5}"
echo
# Activation recomputation on a pipeline stage: peak memory and step time with and without
env -u OMP_PLACES OMP_NUM_THREADS=1 OMP_PROC_BIND=false mpiexec -n 2 --bind-to none "$build/bench/bench_recompute" "${PMT_BENCH_REPS_RECOMPUTE:-5}"
echo
# Loss against communicated bytes: synchronous, bf16-compressed, local SGD and DiLoCo on the main job's GPT (4 ranks)
python3 "$root/bench/dp_comm.py" "$build" 4 "${PMT_BENCH_STEPS_DP:-800}" 8
echo
# What the instrumentation costs (compiled out / recorder off / recorder on)
python3 "$root/bench/trace_overhead.py" "$build" "${PMT_BENCH_ROUNDS_TRACE:-7}"
echo
# The planner's predictions against every candidate trained side by side (4 ranks: 2 per core, bound; 2 ranks)
python3 "$root/bench/plan_check.py" "$build" 4 "${PMT_BENCH_REPS_PLAN:-3}" 8
echo
python3 "$root/bench/plan_check.py" "$build" 2 "${PMT_BENCH_REPS_PLAN:-3}" 8
echo
# Asynchronous checkpoints: the step while a 150 MB checkpoint is written, the snapshot against a copy in memory
"$build/bench/bench_checkpoint"
echo
# ZeRO-3: per-rank memory at dp 4 against plain data parallelism and the planner, step time at dp 2 against ZeRO-1
env -u OMP_PLACES OMP_NUM_THREADS=1 OMP_PROC_BIND=false mpiexec -n 4 --oversubscribe --bind-to none "$build/bench/bench_zero3" memory
echo
env -u OMP_PLACES OMP_NUM_THREADS=1 OMP_PROC_BIND=false mpiexec -n 2 --bind-to none "$build/bench/bench_zero3" time "${PMT_BENCH_STEPS_ZERO3:-4}"
