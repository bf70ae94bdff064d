// SPDX-License-Identifier: Apache-2.0
// Prints the measured fp32 FMA peak (best of 3) and the ISA it used. Built twice, with and without
// -march=native: the peak is the CPU's, so both builds must measure the same (peak_probe.cmake).
#include "pmt/obs/peak.hpp"

#include <algorithm>
#include <cstdio>

int main(int argc, char* argv[]) {
  Kokkos::ScopeGuard guard(argc, argv);
  double best = 0;
  for (int k = 0; k < 3; ++k) best = std::max(best, pmt::obs::measured_fp32_peak_gflops(10'000'000));
  std::printf("peak %.1f GFLOP/s (%s)\n", best, pmt::obs::peak_isa_description().c_str());
  return 0;
}
