#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Fetches Intel MKL's shared libraries from its PyPI wheel into ~/.cache/pmt/mkl/lib (only what
# bench_matmul loads with dlopen) and prints the path to export as PMT_MKL_LIB.
set -euo pipefail
dest=${PMT_DEPS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pmt}/mkl
if ! ls "$dest"/lib/libmkl_rt.so.* >/dev/null 2>&1; then
  tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$tmp" mkl >&2
  mkdir -p "$dest/lib"
  (cd "$dest/lib" && unzip -q -j -o "$tmp"/mkl-*.whl '*/lib/libmkl_rt.so.*' '*/lib/libmkl_core.so.*' \
     '*/lib/libmkl_gnu_thread.so.*' '*/lib/libmkl_intel_lp64.so.*' '*/lib/libmkl_def.so.*' \
     '*/lib/libmkl_avx2.so.*' '*/lib/libmkl_avx512.so.*' '*/lib/libmkl_mc3.so.*' '*/lib/libmkl_sequential.so.*' 2>/dev/null || true)
fi
ls "$dest"/lib/libmkl_rt.so.* | head -n 1
