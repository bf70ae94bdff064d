// SPDX-License-Identifier: Apache-2.0
// Starts pmt's environment (MPI if enabled, then Kokkos) and prints what this build and this
// machine provide. Run with mpiexec to see every rank agree on the world.
#include <pmt/pmt.hpp>

#include <cstdio>

int main(int argc, char* argv[]) {
  pmt::ScopeGuard guard(argc, argv);
  if (pmt::world_rank() == 0) std::printf("pmt environment\n%s", pmt::environment_report().c_str());
  return 0;
}
