// SPDX-License-Identifier: Apache-2.0
#pragma once
// Shared pieces of pmt's benchmarks: median timing, the measured fp32 FMA peak of this machine,
// a description of the BLAS in use, and the `target NAME measured=X goal=Y met|missed` line.

#include <pmt/pmt.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

namespace pmt::bench {

/// Median seconds of `reps` runs of fn (after one warm-up run); fn must fence its own work.
inline double median_seconds(int reps, const std::function<void()>& fn) {
  fn();
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

/// Median seconds of each of `fns` over `reps` rounds, timed interleaved (one run of each per
/// round, the order rotating each round) after one warm-up run of each: slow phases of a shared
/// machine then hit every contestant alike, which keeps their ratios honest.
inline std::vector<double> interleaved_medians(int reps, const std::vector<std::function<void()>>& fns) {
  const std::size_t k = fns.size();
  std::vector<std::vector<double>> t(k);
  for (const auto& fn : fns) fn();
  for (int r = 0; r < reps; ++r)
    for (std::size_t i = 0; i < k; ++i) {
      const std::size_t f = (i + static_cast<std::size_t>(r)) % k;
      const auto t0 = std::chrono::steady_clock::now();
      fns[f]();
      t[f].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  std::vector<double> med(k);
  for (std::size_t f = 0; f < k; ++f) {
    std::sort(t[f].begin(), t[f].end());
    med[f] = t[f][t[f].size() / 2];
  }
  return med;
}

/// fp32 FMA throughput of all OpenMP threads together, in GFLOP/s: each thread runs 12
/// independent vector accumulator chains (enough to hide FMA latency on current x86 cores).
inline double measured_fp32_peak_gflops() {
  typedef float vec __attribute__((vector_size(pmt::detail::host_vector_bytes)));
  constexpr int lanes = pmt::detail::host_vector_bytes / 4, chains = 12;
  const long iters = 20'000'000;
  const int threads = Kokkos::DefaultHostExecutionSpace().concurrency();
  Kokkos::View<float*, Kokkos::HostSpace> sink("sink", threads);
  const double s = median_seconds(3, [&] {
    Kokkos::parallel_for(
        "pmt::bench::peak", Kokkos::RangePolicy<Kokkos::DefaultHostExecutionSpace>(0, threads),
        [=](int t) {
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
  });
  return 2.0 * lanes * chains * double(iters) * threads / s / 1e9;
}

inline void target_line(const std::string& name, double measured, double goal, bool higher_is_better = true) {
  const bool met = higher_is_better ? measured >= goal : measured <= goal;
  std::printf("target %s measured=%.3f goal=%.3f %s\n", name.c_str(), measured, goal, met ? "met" : "missed");
}

}  // namespace pmt::bench
