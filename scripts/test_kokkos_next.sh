#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# pmt's tests built against the newest Kokkos Debian packages (Kokkos 5.x, OpenMP, C++20)
# and run: the proof that pmt works on a current Kokkos, not only on Debian 12's 3.4.
#
# scripts/kokkos_next.sh unpacks Debian unstable's Kokkos and the C/C++ runtimes it was built
# against into ~/.cache/pmt/kokkos-next/root. The tests are built in build-next/ (or
# $PMT_BUILD_NEXT_DIR) with this machine's g++ (-std=c++20 from Kokkos' target, -Werror), MPI,
# OpenBLAS and Catch2, and linked so that they start with that tree's loader and find its libc,
# libstdc++, libgomp and Kokkos first (-Wl,--dynamic-linker, an RPATH). Every ctest entry runs,
# the compile-fail tests included, except the find_package(pmt) consumers (install_*): they are
# separate CMake projects, linked without the flags above, and the main build runs them; and
# except the checks of how ranks talk and stop, which the Kokkos version does not enter and the
# main build runs: the runs under NCCL's matching rules (*_nccl_rules_*), the emulated two-node
# runs, failing ranks (failing_rank_*), train_gpt's signal, lock and watchdog cases
# (train_gpt_safety), the test harness's own cases (harness_*) and the planner's node calibration.
#
# Called by scripts/test.sh after the main suite; PMT_KOKKOS_NEXT=off skips it. Extra arguments go
# to ctest.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${PMT_BUILD_NEXT_DIR:-$root/build-next}
next_root=$("$root/scripts/kokkos_next.sh" | sed -n 's/^KOKKOS_NEXT_ROOT=//p')
if [ -z "$next_root" ]; then
  echo "[pmt kokkos-next] PMT_KOKKOS_NEXT=off: pmt's tests are not run against a newer Kokkos"
  exit 0
fi
lib="$next_root/usr/lib/x86_64-linux-gnu"
loader="$next_root/usr/lib64/ld-linux-x86-64.so.2"
# --allow-shlib-undefined: libkokkoscore needs symbols of the newer glibc/libstdc++, which the
# linker cannot check against Debian 12's; the loader above resolves them at run time.
link="-Wl,--dynamic-linker=$loader -Wl,--disable-new-dtags -Wl,-rpath,$lib -Wl,--allow-shlib-undefined"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DPMT_WARNINGS_AS_ERRORS=ON \
  -DKokkos_DIR="$next_root/cmake/Kokkos" -DCMAKE_EXE_LINKER_FLAGS="$link" \
  -DPMT_ENABLE_BENCH=OFF >"$build.configure.log" 2>&1 \
  || { cat "$build.configure.log"; exit 1; }
grep -E "^-- pmt " "$build.configure.log" || true
cmake --build "$build" -j "$(nproc)"
cd "$build"
ctest --output-on-failure -j "$(nproc)" --timeout 900 \
  -E '^install_|_nccl_rules_|_two_emulated_nodes$|^failing_rank_|^train_gpt_safety$|^harness_|^pmt_plan_calibrated_nodes$' \
  "$@"
