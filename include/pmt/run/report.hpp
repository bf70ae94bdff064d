// SPDX-License-Identifier: Apache-2.0
#pragma once
// Part of the run harness (pmt/run.hpp): programs include it; the library never does.
// rank_report: the straggler and imbalance report at the end of a run: per rank its compute time
// (step time outside communication calls), its communication time (inside them, waiting
// included), its idle time (the slowest rank's compute minus its own) and its peak memory.

#include "pmt/comm/collectives.hpp"
#include "pmt/comm/mesh.hpp"
#include "pmt/core/error.hpp"

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

namespace pmt::run {

/// One rank's totals over a run's steps.
struct RankTotals {
  double compute_s = 0, comm_s = 0;
  double peak_bytes = 0;  ///< < 0: not measured
};

/// Collective over `world` (ranks laid out as pmt::Mesh lays them: tp fastest, then dp, then pp):
/// gathers every rank's totals; rank 0 prints the table over `steps` steps. Returns every rank's
/// totals (on every rank).
template <class B>
std::vector<RankTotals> rank_report(const comm::Communicator<B>& world, const MeshShape& shape, const RankTotals& mine,
                                    int steps) {
  const auto n = static_cast<std::size_t>(world.size());
  Kokkos::View<double*, Kokkos::HostSpace> one("pmt::run::rank_report::mine", 3),
      all("pmt::run::rank_report::all", 3 * n);
  one(0) = mine.compute_s, one(1) = mine.comm_s, one(2) = mine.peak_bytes;
  comm::all_gather(world, Kokkos::DefaultHostExecutionSpace(), one, all);
  std::vector<RankTotals> totals(n);
  for (std::size_t q = 0; q < n; ++q) totals[q] = {all(3 * q), all(3 * q + 1), all(3 * q + 2)};
  if (world.rank() != 0 || steps <= 0) return totals;
  double slowest = 0, mean = 0;
  for (const auto& t : totals) slowest = std::max(slowest, t.compute_s), mean += t.compute_s / double(n);
  std::printf(
      "per-rank time over %d steps (compute = step time outside communication calls; comm = inside them,\n"
      "waiting included; idle = the slowest rank's compute minus this rank's) and peak memory (Kokkos\n"
      "allocations: parameters, gradients, optimizer state, activations, buffers):\n",
      steps);
  std::printf("  rank  %-26s %10s %10s %10s %10s\n", "dp / tp / pp", "compute s", "comm s", "idle s", "peak MiB");
  for (std::size_t q = 0; q < n; ++q) {
    const int r = static_cast<int>(q), tp = r % shape.tp, dp = r / shape.tp % shape.dp, pp = r / (shape.tp * shape.dp);
    const auto& t          = totals[q];
    const std::string peak = t.peak_bytes >= 0 ? pmt::detail::str(std::round(t.peak_bytes / 10485.76) / 100) : "-";
    std::printf("  %4d  dp %d/%d, tp %d/%d, pp %d/%d%*s %10.2f %10.2f %10.2f %10s%s\n", r, dp, shape.dp, tp, shape.tp,
                pp, shape.pp, 4, "", t.compute_s, t.comm_s, slowest - t.compute_s, peak.c_str(),
                t.compute_s == slowest && n > 1 ? "  <- slowest" : "");
  }
  std::printf("imbalance (slowest / mean compute): %.3f\n", mean > 0 ? slowest / mean : 1.0);
  return totals;
}

}  // namespace pmt::run
