#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# pmt built against another CBLAS than OpenBLAS: Intel MKL (scripts/build_mkl.sh, build-mkl/),
# and the tests whose results go through the BLAS run there: the ops against references and
# finite differences, the layers, the Gpt, and every dp x tp layout equal to one rank; test_core
# checks that the environment report names MKL, test_matmul_auto that MatmulAuto finds MKL's bf16
# GEMM and times it against pmt's kernel.
#
# Called by scripts/test.sh after the main suite; PMT_MKL=off skips it (say so in what you report).
# Extra arguments go to ctest.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [ "${PMT_MKL:-on}" = "off" ]; then
  echo "[pmt mkl] PMT_MKL=off: pmt's tests are not run against MKL"
  exit 0
fi
"$root/scripts/build_mkl.sh" test_core test_ops test_matmul_auto test_nn test_gpt test_train
cd "${PMT_BUILD_MKL_DIR:-$root/build-mkl}"
ctest --output-on-failure -j "$(nproc)" --timeout 900 -R '^test_(core|ops|matmul_auto|nn|gpt|train)_np' "$@"
