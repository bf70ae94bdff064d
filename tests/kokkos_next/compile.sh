#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Compile-only check of pmt on Kokkos::Cuda with a newer Kokkos than the one the build uses (the
# headers of Debian unstable's libkokkos-dev, fetched by scripts/kokkos_next.sh: Kokkos 5.x, C++20).
# (On OpenMP the whole suite is built and run against that Kokkos: scripts/test_kokkos_next.sh.)
#
#   compile.sh cuda OUT FLAGS KOKKOS_INCLUDE files...
#     nvcc for sm_90 (Hopper) against a copy of the same headers whose configuration turns on
#     Kokkos' CUDA backend (KokkosCore_config.h and the backend lists, as Kokkos' CMake writes
#     them for -DKokkos_ENABLE_CUDA=ON -DKokkos_ARCH_HOPPER90=ON): host and device code of every
#     instantiation is compiled. Nothing is linked: no CUDA-enabled Kokkos library exists here.
#
# FLAGS: a file with one compiler flag per line (pmt's definitions and dependency include dirs,
# written by tests/CMakeLists.txt). Exit status: 0 when every file compiles.
set -euo pipefail
mode=$1 out=$2 flags_file=$3 kinc=$4
shift 4
mapfile -t flags <"$flags_file"
mkdir -p "$out"
version=$(sed -n 's/^#define KOKKOS_VERSION \([0-9]*\)$/\1/p' "$kinc/KokkosCore_config.h")
[ -n "$version" ] || { echo "no KOKKOS_VERSION in $kinc/KokkosCore_config.h" >&2; exit 1; }

case "$mode" in
  cuda)
    command -v nvcc >/dev/null || { echo "nvcc not found" >&2; exit 1; }
    cfg="$out/kokkos-cuda"
    rm -rf "$cfg" && mkdir -p "$cfg" && cp -rL "$kinc" "$cfg/include"
    h="$cfg/include/KokkosCore_config.h"
    for m in KOKKOS_ENABLE_CUDA KOKKOS_ENABLE_CUDA_CONSTEXPR KOKKOS_ARCH_HOPPER KOKKOS_ARCH_HOPPER90; do
      grep -q "^/\* #undef $m \*/$" "$h" || { echo "$h: no '#undef $m' to turn on" >&2; exit 1; }
      sed -i "s|^/\* #undef $m \*/$|#define $m|" "$h"
    done
    d="$cfg/include/desul/atomics/Config.hpp"
    grep -q '^/\* #undef DESUL_ATOMICS_ENABLE_CUDA \*/$' "$d" || { echo "$d: no DESUL_ATOMICS_ENABLE_CUDA" >&2; exit 1; }
    sed -i 's|^/\* #undef DESUL_ATOMICS_ENABLE_CUDA \*/$|#define DESUL_ATOMICS_ENABLE_CUDA|' "$d"
    # the backend lists: the host backend (OpenMP) first, as Kokkos writes them
    sed -i 's|^#include <decl/Kokkos_Declare_OPENMP.hpp>$|&\n#include <decl/Kokkos_Declare_CUDA.hpp>|' \
      "$cfg/include/KokkosCore_Config_DeclareBackend.hpp"
    sed -i 's|^#include <fwd/Kokkos_Fwd_OPENMP.hpp>$|&\n#include <fwd/Kokkos_Fwd_CUDA.hpp>|' \
      "$cfg/include/KokkosCore_Config_FwdBackend.hpp"
    sed -i 's|^#define KOKKOS_SETUP_HPP_$|&\n#include <setup/Kokkos_Setup_Cuda.hpp>|' \
      "$cfg/include/KokkosCore_Config_SetupBackend.hpp"
    grep -q Kokkos_Declare_CUDA "$cfg/include/KokkosCore_Config_DeclareBackend.hpp" \
      || { echo "could not add the CUDA backend to the declarations" >&2; exit 1; }
    echo "Kokkos $version (CUDA for sm_90 + OpenMP), $(nvcc --version | tail -n 1)"
    for f in "$@"; do
      start=$(date +%s)
      nvcc -x cu -std=c++20 --extended-lambda --expt-relaxed-constexpr -arch=sm_90 -Werror all-warnings \
        -Xcompiler -fopenmp,-Wall,-Wextra,-Werror "${flags[@]}" -isystem "$cfg/include" \
        -c "$f" -o "$out/$(basename "$f").o"
      echo "compiled $f for Kokkos::Cuda ($(( $(date +%s) - start )) s)"
    done
    ;;
  *)
    echo "usage: compile.sh cuda OUT FLAGS KOKKOS_INCLUDE files..." >&2
    exit 2
    ;;
esac
