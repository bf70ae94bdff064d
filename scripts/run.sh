#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The main job: builds pmt (dependencies included) and trains a byte-level GPT on the project's
# documentation with examples/train_gpt on $PMT_NP ranks (default 4) as tp 2 x pp 2, 800 steps
# (about a minute on 2 cores). Extra arguments go to train_gpt after these defaults and override
# them (see --help), e.g. ./scripts/run.sh --tp 1 --pp 1 (dp 4), or PMT_NP=2 ./scripts/run.sh --pp 1;
# ./scripts/run.sh --auto lets the planner choose the layout (docs/planner.md).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/scripts/build.sh" >/dev/null
build=${PMT_BUILD_DIR:-$root/build}
np=${PMT_NP:-4}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( $(nproc) / np > 0 ? $(nproc) / np : 1 ))}
# Several ranks on one node: no OpenMP binding (it would pin every rank's threads to the same cores).
export OMP_PROC_BIND=${OMP_PROC_BIND:-false}
"$build/examples/00_environment" >/dev/null 2>&1 || true
exe="$build/examples/train_gpt"
defaults=(--tp 2 --pp 2 --steps 800 --val-every 200 --kokkos-disable-warnings)
[ "$np" -ge 4 ] || defaults=(--steps 800 --val-every 200 --kokkos-disable-warnings)
# --auto: the planner chooses the layout, so the default one is left out
for a in "$@"; do [ "$a" != "--auto" ] || defaults=(--steps 800 --val-every 200 --kokkos-disable-warnings); done
if command -v mpiexec >/dev/null 2>&1 && [ "$np" -gt 1 ]; then
  exec mpiexec -n "$np" --oversubscribe --bind-to none "$exe" "${defaults[@]}" "$@"
fi
exec "$exe" "${defaults[@]}" "$@"
