#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The main job: builds pmt (dependencies included) and runs its main example on $PMT_NP ranks
# (default 2). Extra arguments go to the example.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/scripts/build.sh" >/dev/null
build=${PMT_BUILD_DIR:-$root/build}
np=${PMT_NP:-2}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( $(nproc) / np > 0 ? $(nproc) / np : 1 ))}
export OMP_PROC_BIND=${OMP_PROC_BIND:-spread} OMP_PLACES=${OMP_PLACES:-threads}
exe="$build/examples/00_environment"
if command -v mpiexec >/dev/null 2>&1 && [ "$np" -gt 1 ]; then
  exec mpiexec -n "$np" --oversubscribe --bind-to none "$exe" "$@"
fi
exec "$exe" "$@"
