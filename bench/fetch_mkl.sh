#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Fetches Intel MKL from its PyPI wheels (mkl, mkl-include; version pinned below) into
# ~/.cache/pmt/mkl-<version>: only the shared libraries pmt loads or links and the C headers.
#   fetch_mkl.sh          prints the path of libmkl_rt (for bench_matmul: PMT_MKL_LIB, dlopen)
#   fetch_mkl.sh --cmake  prints the CMake arguments that build pmt against MKL's CBLAS instead
#                         of OpenBLAS (GNU OpenMP threading, sharing Kokkos' OpenMP threads):
#                         cmake -S . -B build-mkl $(bench/fetch_mkl.sh --cmake)
set -euo pipefail
version=${PMT_MKL_VERSION:-2026.2.0}
dest=${PMT_DEPS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pmt}/mkl-$version
if ! ls "$dest"/lib/libmkl_rt.so.* "$dest"/include/mkl_cblas.h >/dev/null 2>&1; then
  tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$tmp" "mkl==$version" "mkl-include==$version" >&2
  mkdir -p "$dest/lib" "$dest/include"
  (cd "$dest/lib" && unzip -q -j -o "$tmp"/mkl-"$version"-*.whl '*/lib/libmkl_rt.so.*' '*/lib/libmkl_core.so.*' \
     '*/lib/libmkl_gnu_thread.so.*' '*/lib/libmkl_intel_lp64.so.*' '*/lib/libmkl_def.so.*' \
     '*/lib/libmkl_avx2.so.*' '*/lib/libmkl_avx512.so.*' '*/lib/libmkl_mc3.so.*' '*/lib/libmkl_sequential.so.*' 2>/dev/null || true)
  (cd "$dest/include" && unzip -q -j -o "$tmp"/mkl_include-*.whl '*/include/*.h')
fi
if [ "${1:-}" = "--cmake" ]; then
  lib() { ls "$dest"/lib/"$1".so.* | head -n 1; }
  echo "-DPMT_CBLAS_LIBRARIES_USER=$(lib libmkl_intel_lp64);$(lib libmkl_gnu_thread);$(lib libmkl_core) -DPMT_CBLAS_INCLUDE_DIR=$dest/include"
else
  ls "$dest"/lib/libmkl_rt.so.* | head -n 1
fi
