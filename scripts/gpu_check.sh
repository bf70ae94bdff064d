#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The prepared device check: pmt's programs on Kokkos::Cuda, on a machine with an NVIDIA GPU, the
# CUDA 13 toolkit (nvcc, cuBLAS) and many cores, but no Kokkos, no CMake and no network.
#
#   scripts/gpu_check.sh pack   # here, on the build machine: fills build-gpu-pack/ (about 19 MiB:
#                               # the Kokkos::Cuda install of scripts/kokkos_cuda.sh with its
#                               # nvcc_wrapper, the OpenBLAS of scripts/openblas.sh, the CLI11 and
#                               # nlohmann-json headers train_gpt uses) and prints its size
#   scripts/gpu_check.sh        # there, with build-gpu-pack/ carried along: builds and runs
#
# Stages and their budgets (seconds; the whole check stays under 10 minutes):
#   probe      5   the GPU(s), nvcc, MPI and NCCL on the machine
#   build    240   train_gpt (and cuda_step where MPI is installed) compiled by nvcc_wrapper in
#                  parallel, for sm_90, straight from the headers (pmt is header-only): no CMake
#   small     60   train_gpt, 50 steps of the default model (4 layers, width 128, context 64,
#                  batch 8, fp32) on the GPU (--device default), then on the host's cores
#                  (--device host) with the same binary; every step's loss compared: the GPU
#                  sums in other orders, so the losses agree to a relative 2e-3 (the check's
#                  tolerance), not bit for bit
#   gpt2     150   GPT-2 124M's shape (12 layers, width 768, 12 heads, context 1024; byte
#                  vocabulary), bf16 products, batch 8, 12 steps: tokens/s and MFU against the
#                  GPU's bf16 tensor-core peak; target: MFU >= 40 %
#   nccl     120   with 2 GPUs and MPI: dp 2, tp 2 and pp 2 over NCCL, 20 steps each, losses
#                  against the one-GPU run (same relative 2e-3)
#   cuda_step 60   with MPI: every op family on device Views against the host, and two
#                  training steps of a Gpt over NCCL (tests/cuda/cuda_step.cpp)
# Each stage prints its time; logs go to $OUT (or build-gpu-check/). The last lines are the
# targets: `target NAME measured=X goal=Y met|missed`. Exit status: 0 when every check ran and held.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
pack=$root/build-gpu-pack

if [ "${1:-}" = pack ]; then
  set -e
  prefix=$("$root/scripts/kokkos_cuda.sh" | sed -n 's/^KOKKOS_CUDA_PREFIX=//p')
  [ -n "$prefix" ] || { echo "[pmt gpu-check] no Kokkos::Cuda build here (scripts/kokkos_cuda.sh)"; exit 1; }
  openblas=$("$root/scripts/openblas.sh" | sed -n 's/^OPENBLAS_PREFIX=//p')
  rm -rf "$pack" && mkdir -p "$pack/include" "$pack/openblas/lib"
  cp -rL "$prefix" "$pack/kokkos"  # plain files: links may not travel
  for h in CLI nlohmann; do cp -rL "/usr/include/$h" "$pack/include/$h"; done
  if [ -n "$openblas" ]; then  # the library under its soname, and its headers
    cp -L "$openblas/lib/libopenblas.so.0" "$pack/openblas/lib/libopenblas.so.0"
    cp -rL "$openblas/include" "$pack/openblas/include"
  fi
  echo "[pmt gpu-check] $pack: $(du -sh "$pack" | cut -f1) (Kokkos 4.7.0 for sm_90 with nvcc_wrapper," \
       "${openblas:+OpenBLAS 0.3.29, }CLI11, nlohmann-json); carry it with the working tree"
  exit 0
fi

out=${OUT:-$root/build-gpu-check}
mkdir -p "$out"
fails=0
targets=()
t_all=$(date +%s)
stage() { echo; echo "== $1 (budget $2 s)"; t_stage=$(date +%s); }
done_stage() { echo "== $1: $(( $(date +%s) - t_stage )) s"; }
target() { targets+=("target $1 measured=$2 goal=$3 $4"); [ "$4" = met ] || fails=$((fails + 1)); }

stage probe 5
[ -d "$pack/kokkos" ] || { echo "no $pack: run 'scripts/gpu_check.sh pack' on the build machine and carry it"; exit 1; }
command -v nvcc >/dev/null || { echo "no nvcc on the PATH"; exit 1; }
nvcc --version | tail -n 2
gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | wc -l)
nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm --format=csv,noheader 2>/dev/null || true
cuda=$(dirname "$(dirname "$(command -v nvcc)")")
cudalib=$cuda/lib64; [ -d "$cudalib" ] || cudalib=$cuda/lib
# MPI and NCCL together (GPU ranks talk over NCCL, bootstrapped by MPI), or neither (one rank)
mpi=0; command -v mpicxx >/dev/null && command -v mpiexec >/dev/null && mpi=1
nccl=0; { [ -f "$cuda/include/nccl.h" ] || [ -f /usr/include/nccl.h ]; } && nccl=$mpi
mpi=$nccl
echo "GPUs: $gpus; CUDA: $cuda; MPI and NCCL: $nccl; cores: $(nproc)"
if [ "$gpus" -lt 1 ] && [ "${PMT_GPU_CHECK_UNTIL:-}" != build ]; then echo "no GPU answers nvidia-smi"; exit 1; fi
done_stage probe

stage build 240
kokkos=$pack/kokkos
chmod +x "$kokkos/bin/nvcc_wrapper"
blas=0; [ -f "$pack/openblas/lib/libopenblas.so.0" ] && blas=1
defs=(-DKOKKOS_DEPENDENCE -DPMT_ENABLE_CUDA=1 -DPMT_ENABLE_CBLAS=$blas -DPMT_HAVE_OPENBLAS_INFO=$blas
      "-DPMT_DEFAULT_DATA_DIR=\"$root/docs\"" -DPMT_ENABLE_MPI=$mpi -DPMT_ENABLE_NCCL=$nccl)
flags=(-O3 -DNDEBUG -std=c++17 -extended-lambda -arch=sm_90 -fopenmp -march=native -I"$root/include"
       -isystem "$kokkos/include" -isystem "$pack/include" -isystem "$cuda/include")
[ "$blas" = 1 ] && flags+=(-isystem "$pack/openblas/include")
libs=("$kokkos"/lib/libkokkoscontainers.a "$kokkos"/lib/libkokkoscore.a -L"$cudalib" -lcublasLt -lcublas -lcudart
      -L"$cudalib/stubs" -lcuda -ldl -lgomp)  # the driver's libcuda where installed, else the stub
[ "$nccl" = 1 ] && libs+=(-lnccl)
[ "$blas" = 1 ] && libs+=("$pack/openblas/lib/libopenblas.so.0" -Xlinker -rpath -Xlinker "$pack/openblas/lib")
libs+=(-Xlinker -rpath -Xlinker "$cudalib")
cxx=("$kokkos/bin/nvcc_wrapper")
if [ "$mpi" = 1 ]; then
  export OMPI_CXX="$kokkos/bin/nvcc_wrapper"  # mpicxx adds MPI's flags around nvcc_wrapper
  cxx=(mpicxx)
fi
export NVCC_WRAPPER_DEFAULT_COMPILER=${NVCC_WRAPPER_DEFAULT_COMPILER:-g++}
"${cxx[@]}" "${defs[@]}" "${flags[@]}" "$root/examples/train_gpt.cpp" -o "$out/train_gpt" "${libs[@]}" \
  >"$out/build_train_gpt.log" 2>&1 &
b1=$!
b2=
if [ "$nccl" = 1 ] && [ "$blas" = 1 ]; then  # cuda_step compares with the host's BLAS
  "${cxx[@]}" "${defs[@]}" "${flags[@]}" "$root/tests/cuda/cuda_step.cpp" -o "$out/cuda_step" "${libs[@]}" \
    >"$out/build_cuda_step.log" 2>&1 &
  b2=$!
fi
wait $b1 || { tail -n 30 "$out/build_train_gpt.log"; echo "train_gpt did not build"; exit 1; }
if [ -n "$b2" ]; then wait "$b2" || { tail -n 30 "$out/build_cuda_step.log"; fails=$((fails + 1)); }; fi
done_stage build
if [ "${PMT_GPU_CHECK_UNTIL:-}" = build ]; then echo "built (PMT_GPU_CHECK_UNTIL=build)"; exit "$fails"; fi

run1() {  # one rank (MPI's singleton start where MPI is built in)
  OMP_NUM_THREADS=${THREADS:-$(nproc)} OMP_PROC_BIND=false timeout "$1" "$out/train_gpt" "${@:2}"
}
field() {  # field FILE KEY: "STEP VALUE" for each JSON line holding both (the keys come in any order)
  awk -v k="\"$2\":" '{ if (!match($0, /"step":[0-9]+/)) next; s = substr($0, RSTART + 7, RLENGTH - 7)
    i = index($0, k); if (i == 0) next; v = substr($0, i + length(k)); sub(/[,}].*/, "", v); print s, v }' "$1"
}
losses() { field "$1" loss; }
compare() {  # compare NAME A.json B.json: every common step's loss within a relative 2e-3
  local worst
  worst=$(join <(losses "$2" | sort -k1,1) <(losses "$3" | sort -k1,1) |
          awk 'BEGIN{w=0;n=0} {d=($2-$3)/$3; if(d<0)d=-d; if(d>w)w=d; n++} END{if(n==0)print "none"; else printf "%.2e", w}')
  echo "$1: largest relative loss difference over the steps: $worst"
  if [ "$worst" = none ]; then target "$1" none 2e-3 missed; return; fi
  target "$1" "$worst" 2e-3 "$(awk -v w="$worst" 'BEGIN{print (w <= 2e-3) ? "met" : "missed"}')"
}

stage small 60
small=(--steps 50 --val-every 0 --seed 1 --no-memory-report)
run1 50 "${small[@]}" --device default --metrics "$out/gpu.json" >"$out/small_gpu.log" 2>&1
echo "GPU: exit $?"; grep -E "^pmt train_gpt|peak of all|^step +(0|49)/" "$out/small_gpu.log"
run1 50 "${small[@]}" --device host --metrics "$out/cpu.json" >"$out/small_cpu.log" 2>&1
echo "host: exit $?"; grep -E "^step +(0|49)/" "$out/small_cpu.log"
compare gpu_losses_equal_host "$out/gpu.json" "$out/cpu.json"
done_stage small

stage gpt2 150
run1 140 --layers 12 --width 768 --heads 12 --context 1024 --batch 8 --steps 12 --warmup 2 --val-every 0 \
  --precision bf16 --no-memory-report --device default --metrics "$out/gpt2.json" >"$out/gpt2.log" 2>&1
echo "exit $?"; grep -E "^pmt train_gpt|peak of all|^step +([0-9]|1[01])/" "$out/gpt2.log"
mfu=$(field "$out/gpt2.json" mfu | tail -n 5 | cut -d' ' -f2 | sort -g | awk '{a[NR]=$1} END{print (NR ? a[int((NR+1)/2)] : "none")}')
if [ "$mfu" = none ] || [ -z "$mfu" ]; then
  target gpt2_124m_bf16_mfu none 0.40 missed
else
  target gpt2_124m_bf16_mfu "$mfu" 0.40 "$(awk -v m="$mfu" 'BEGIN{print (m >= 0.40) ? "met" : "missed"}')"
fi
done_stage gpt2

if [ "$gpus" -ge 2 ] && [ "$nccl" = 1 ]; then
  stage nccl 120
  mpirun=(mpiexec -n 2 --oversubscribe --bind-to none -x OMP_NUM_THREADS=4 -x OMP_PROC_BIND=false)
  [ "$(id -u)" = 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  for layout in "--dp 2" "--tp 2" "--pp 2"; do
    name=$(echo "$layout" | tr -d ' -')
    # shellcheck disable=SC2086
    timeout 40 "${mpirun[@]}" "$out/train_gpt" --steps 20 --val-every 0 --seed 1 --no-memory-report $layout \
      --device default --comm nccl --metrics "$out/nccl_$name.json" >"$out/nccl_$name.log" 2>&1
    echo "$layout over NCCL: exit $?"; grep -E "^pmt train_gpt|^step +19/" "$out/nccl_$name.log"
    compare "nccl_${name}_losses_equal_one_gpu" "$out/nccl_$name.json" "$out/gpu.json"
  done
  done_stage nccl
else
  echo; echo "== nccl: skipped ($gpus GPU(s), NCCL with MPI: $nccl)"
fi

if [ -x "$out/cuda_step" ]; then
  stage cuda_step 60
  timeout 60 "$out/cuda_step" >"$out/cuda_step.log" 2>&1
  rc=$?; cat "$out/cuda_step.log" | tail -n 20; echo "cuda_step: exit $rc"
  target cuda_step_exit "$rc" 0 "$([ "$rc" = 0 ] && echo met || echo missed)"
  done_stage cuda_step
fi

echo; echo "gpu_check: $(( $(date +%s) - t_all )) s in all"
printf '%s\n' "${targets[@]}"
[ "$fails" = 0 ]
