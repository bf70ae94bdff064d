#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The main job: builds pmt (dependencies included) and trains a byte-level GPT on the project's
# documentation with examples/01_train_gpt on $PMT_NP ranks (default 2; all data-parallel unless
# --tp is given). Extra arguments go to the example (see --help), e.g. PMT_NP=4 ./scripts/run.sh --tp 2.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/scripts/build.sh" >/dev/null
build=${PMT_BUILD_DIR:-$root/build}
np=${PMT_NP:-2}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( $(nproc) / np > 0 ? $(nproc) / np : 1 ))}
# Several ranks on one node: no OpenMP binding (it would pin every rank's threads to the same cores).
export OMP_PROC_BIND=${OMP_PROC_BIND:-false}
"$build/examples/00_environment" >/dev/null 2>&1 || true
exe="$build/examples/01_train_gpt"
if command -v mpiexec >/dev/null 2>&1 && [ "$np" -gt 1 ]; then
  exec mpiexec -n "$np" --oversubscribe --bind-to none "$exe" "$@"
fi
exec "$exe" "$@"
