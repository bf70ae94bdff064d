#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The test suite under every runtime check at once, in build-check/ (or $PMT_CHECK_BUILD_DIR):
#   - AddressSanitizer (out-of-bounds, use after free, leaks: scripts/lsan.supp lists what the
#     MPI stack, OpenMP and OpenBLAS keep for the process' lifetime),
#   - UndefinedBehaviorSanitizer, with float-to-integer conversions out of range (which GCC leaves
#     out of -fsanitize=undefined); any finding fails the test,
#   - libstdc++ assertions (_GLIBCXX_ASSERTIONS),
#   - Kokkos 3.4 built with its debug checks and View bounds checking (PMT_KOKKOS_CHECKED=1
#     scripts/deps.sh, a second cache prefix), so every View index is checked,
#   - pmt's collective-matching checks (PMT_DEBUG=1).
# Slower than scripts/test.sh (about 25 min on 2 cores; each test binary may run 900 s instead
# of 120 s before mpiexec ends it), so not part of it; run it before
# changing a kernel's indexing or a communicator. Extra arguments go to ctest (e.g. -R test_ops).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${PMT_CHECK_BUILD_DIR:-$root/build-check}
# Always the checked build from Debian's source: a Kokkos_ROOT of the user's would lack the bounds checks.
kokkos_prefix=$(Kokkos_ROOT= PMT_KOKKOS_CHECKED=1 "$root/scripts/deps.sh" | sed -n 's/^KOKKOS_PREFIX=//p')
flags="-fsanitize=address,undefined,float-cast-overflow -fno-sanitize-recover=all -fno-omit-frame-pointer"
flags+=" -D_GLIBCXX_ASSERTIONS -DPMT_DEBUG=1"
# Not -Werror: GCC 12 warns inside libstdc++'s <regex> under the sanitizers (-Wmaybe-uninitialized);
# scripts/test.sh is the warnings gate.
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPMT_ENABLE_BENCH=OFF \
  -DCMAKE_PREFIX_PATH="$kokkos_prefix" -DPMT_TEST_TIMEOUT=900 \
  -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" \
  -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined" >"$build.configure.log" 2>&1 \
  || { cat "$build.configure.log"; exit 1; }
cmake --build "$build" -j "$(nproc)"
export ASAN_OPTIONS=detect_leaks=1:fast_unwind_on_malloc=0:abort_on_error=0
export LSAN_OPTIONS=suppressions=$root/scripts/lsan.supp:print_suppressions=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# Open MPI unloads its plugins at exit, which would leave their allocations unattributed.
export OMPI_MCA_mca_base_component_disable_dlclose=1
cd "$build"
ctest --output-on-failure -j "$(nproc)" --timeout 1800 "$@"
echo "check: every test passed under ASan, UBSan, libstdc++ assertions and Kokkos bounds checking"
