// SPDX-License-Identifier: Apache-2.0
#pragma once
// The measured fp32 FMA peak of the host threads, for model-FLOPs utilisation (MFU): each thread
// of the default host execution space runs 12 independent vector accumulator chains of the
// machine's SIMD width (enough to hide FMA latency on current x86 cores). 5 M iterations take
// about 0.1 s. On a node shared by several ranks, measure on all ranks at once and add up.

#include "pmt/ops/detail/matmul_kokkos.hpp"  // pmt::detail::host_vector_bytes

#include <Kokkos_Core.hpp>

namespace pmt::obs {

/// \brief fp32 FMA GFLOP/s of all host threads together over `iters` iterations.
inline double measured_fp32_peak_gflops(long iters = 5'000'000) {
  typedef float vec __attribute__((vector_size(pmt::detail::host_vector_bytes)));
  constexpr int lanes = pmt::detail::host_vector_bytes / 4, chains = 12;
  const int threads   = Kokkos::DefaultHostExecutionSpace().concurrency();
  Kokkos::View<float*, Kokkos::HostSpace> sink("pmt::obs::peak::sink", threads);
  Kokkos::Timer timer;
  Kokkos::parallel_for(
      "pmt::obs::peak", Kokkos::RangePolicy<Kokkos::DefaultHostExecutionSpace>(0, threads), [=](int t) {
        vec acc[chains];
        for (int c = 0; c < chains; ++c) acc[c] = vec{} + float(c) * 1e-9f;
        const vec a = vec{} + 0.999999f, b = vec{} + 1e-7f;
        for (long i = 0; i < iters; ++i)
          for (int c = 0; c < chains; ++c) acc[c] = acc[c] * a + b;
        float r = 0;
        for (int c = 0; c < chains; ++c)
          for (int l = 0; l < lanes; ++l) r += acc[c][l];
        sink(t) = r;
      });
  Kokkos::fence();
  return 2.0 * lanes * chains * double(iters) * threads / timer.seconds() / 1e9;
}

}  // namespace pmt::obs
