// SPDX-License-Identifier: Apache-2.0
#pragma once
// Shared pieces of pmt's benchmarks: median timing, the measured fp32 FMA peak of this machine,
// a description of the BLAS in use, and the `target NAME measured=X goal=Y met|missed` line.

#include <pmt/obs/memory.hpp>
#include <pmt/tools.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <utility>
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

/// Seconds of each of `fns` in each of `reps` rounds, timed interleaved (one run of each per
/// round) after one warm-up run of each: slow phases of a shared machine then hit every
/// contestant alike, which keeps their ratios honest. Each round runs them in its own order (a
/// fixed-seed shuffle), so no contestant always runs right after the same other one: a run
/// leaves the caches and the threads' state to the next, and a fixed neighbour biases a ratio by
/// a few per cent. t[f][r].
inline std::vector<std::vector<double>> interleaved_times(int reps, const std::vector<std::function<void()>>& fns) {
  const std::size_t k = fns.size();
  std::vector<std::vector<double>> t(k);
  for (const auto& fn : fns) fn();
  std::vector<std::size_t> order(k);
  for (std::size_t i = 0; i < k; ++i) order[i] = i;
  std::mt19937 rng(12345);
  for (int r = 0; r < reps; ++r) {
    std::shuffle(order.begin(), order.end(), rng);
    for (const std::size_t f : order) {
      const auto t0 = std::chrono::steady_clock::now();
      fns[f]();
      t[f].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  return t;
}

/// The median of a non-empty sample (by value: it sorts a copy).
inline double median(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  return x[x.size() / 2];
}

/// Median seconds of each of `fns` over `reps` interleaved rounds (interleaved_times).
inline std::vector<double> interleaved_medians(int reps, const std::vector<std::function<void()>>& fns) {
  const std::vector<std::vector<double>> t = interleaved_times(reps, fns);
  std::vector<double> med;
  for (const auto& tf : t) med.push_back(median(tf));
  return med;
}

/// How much faster `a` ran than `b` (b's time / a's time), as the median over the rounds of each
/// round's own ratio: a round's two runs are adjacent in time, so a slow phase of the machine
/// weighs on both sides of its ratio (the same estimator as bench/train_step.py).
inline double median_round_speedup(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> r;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) r.push_back(b[i] / a[i]);
  return median(r);
}

/// fp32 FMA throughput of all host threads together, in GFLOP/s (pmt/obs/peak.hpp), the best of
/// three runs of 20 M iterations.
inline double measured_fp32_peak_gflops() {
  double best = 0;
  for (int k = 0; k < 3; ++k) best = std::max(best, pmt::obs::measured_fp32_peak_gflops(20'000'000));
  return best;
}

/// Runs `step` (one training step) from an empty workspace with the Kokkos allocations counted
/// (Kokkos Tools memory hook): the peak it adds above what was held before, in MiB, and its
/// seconds.
template <class Step>
std::pair<double, double> measured_step(const Step& step) {
  auto& mem = pmt::obs::MemoryTracker::instance();
  mem.enable();
  pmt::Workspace::instance().release();  // the step allocates its memory afresh, and is measured
  mem.reset_peak();
  const auto base = mem.current_bytes();
  const auto t0   = std::chrono::steady_clock::now();
  step();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double peak    = double(mem.peak_bytes() - base) / (1 << 20);
  mem.enable(false);
  return {peak, seconds};
}

/// Microbatch i of `step` for a token model: `sequences` sequences of `context` tokens, ids and
/// next-token targets from a fixed arithmetic pattern over `vocab` (host Views, as the model's
/// Batch holds them).
template <class Batch>
Batch synthetic_token_batch(int step, std::size_t i, std::size_t sequences, std::size_t context, std::size_t vocab) {
  using Ids           = decltype(Batch::ids);
  const std::size_t N = sequences * context;
  Batch b{Ids("ids", N), Ids("targets", N), sequences, context};
  for (std::size_t n = 0; n < N; ++n) {
    const std::size_t s = i * sequences + n / context, t = n % context;
    b.ids(n)     = static_cast<typename Ids::value_type>((std::size_t(step) * 131 + s * 31 + t * 7 + 3) % vocab);
    b.targets(n) = static_cast<typename Ids::value_type>((std::size_t(step) * 131 + s * 31 + (t + 1) * 7 + 3) % vocab);
  }
  return b;
}

/// The CPU's model name (/proc/cpuinfo), or "unknown CPU".
inline std::string cpu_name() {
  std::string cpu = "unknown CPU";
  if (std::FILE* f = std::fopen("/proc/cpuinfo", "r")) {
    char line[256];
    while (std::fgets(line, sizeof line, f))
      if (std::string(line).rfind("model name", 0) == 0) {
        const char* colon = std::strchr(line, ':');
        if (colon) cpu = std::string(colon + 2);
        if (!cpu.empty() && cpu.back() == '\n') cpu.pop_back();
        break;
      }
    std::fclose(f);
  }
  return cpu;
}

inline void target_line(const std::string& name, double measured, double goal, bool higher_is_better = true) {
  const bool met = higher_is_better ? measured >= goal : measured <= goal;
  if (std::abs(goal) >= 0.01 || goal == 0)
    std::printf("target %s measured=%.3f goal=%.3f %s\n", name.c_str(), measured, goal, met ? "met" : "missed");
  else  // a small goal (a tolerance) in significant digits
    std::printf("target %s measured=%.3g goal=%.3g %s\n", name.c_str(), measured, goal, met ? "met" : "missed");
}

}  // namespace pmt::bench
