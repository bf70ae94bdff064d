// SPDX-License-Identifier: Apache-2.0
// nccl-tests style all-reduce benchmark: pmt::comm::all_reduce against raw MPI_Allreduce in the
// same run, out of place, float sum, message sizes 4 B ... 64 MiB; then pmt::comm::reduce_scatter
// against MPI_Reduce_scatter_block, 64 KiB ... 64 MiB.
//   time   the slowest rank's median over the rounds (each round: barrier, one pmt call, barrier,
//          one MPI call; order alternating by round)
//   algbw  = S / time                         (S = message size in bytes)
//   busbw  = algbw * 2 (n - 1) / n            (bytes each link carries in a ring all-reduce;
//                                              see docs/parallelism.md)
//   check  every element of both results must equal n (n + 1) / 2 exactly (ranks send rank + 1).
#include "bench_common.hpp"

#include <mpi.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <vector>

using Exec = Kokkos::DefaultHostExecutionSpace;

/// After one warm-up call of each side, `rounds` rounds each timing one pmt and one MPI call
/// (time_one(true|false): seconds of one call, between barriers), alternating which goes first;
/// returns {pmt, MPI}: each the slowest rank's median.
template <class TimeOne>
std::array<double, 2> slowest_medians(int rounds, TimeOne&& time_one) {
  time_one(true);
  time_one(false);  // warm-up
  std::vector<double> t_pmt, t_mpi;
  for (int k = 0; k < rounds; ++k) {
    const bool pmt_first = k % 2 == 0;
    const double a = time_one(pmt_first), b = time_one(!pmt_first);
    (pmt_first ? t_pmt : t_mpi).push_back(a);
    (pmt_first ? t_mpi : t_pmt).push_back(b);
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  std::array<double, 2> med{median(t_pmt), median(t_mpi)}, slowest{};
  MPI_Allreduce(med.data(), slowest.data(), 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return slowest;
}

int main(int argc, char* argv[]) {
  pmt::ScopeGuard guard(argc, argv);
  pmt::comm::Communicator<pmt::comm::Mpi> world(MPI_COMM_WORLD);
  const int n = world.size(), r = world.rank();
  Exec exec;
  const std::size_t max_bytes = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : (std::size_t(64) << 20);
  if (r == 0) {
    std::printf("pmt bench_allreduce: %d ranks, float sum, out of place, %s with %d thread(s) per rank\n", n,
                Exec::name(), exec.concurrency());
    std::printf("%12s %10s | %10s %9s %9s | %10s %9s %9s | %8s %s\n", "size(B)", "count", "pmt us", "algbw", "busbw",
                "MPI us", "algbw", "busbw", "pmt/MPI", "check");
  }
  const double bus_factor  = n > 1 ? 2.0 * (n - 1) / n : 1.0;
  double worst_ratio_large = 1e9, lat_pmt = 0, lat_mpi = 0;
  std::vector<std::size_t> sizes;
  for (std::size_t b = 4; b <= max_bytes; b *= 4) sizes.push_back(b);
  if (sizes.empty() || sizes.back() != 8) sizes.insert(sizes.begin() + 1, 8);  // the latency point
  for (std::size_t bytes : sizes) {
    const std::size_t count = bytes / sizeof(float);
    Kokkos::View<float*, Kokkos::LayoutRight, Exec::memory_space> send("send", count), out_pmt("out_pmt", count),
        out_mpi("out_mpi", count);
    Kokkos::deep_copy(send, float(r + 1));
    const int rounds   = bytes <= (64u << 10) ? 400 : (bytes <= (4u << 20) ? 60 : 15);
    const auto slowest = slowest_medians(rounds, [&](bool pmt_side) {
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = MPI_Wtime();
      if (pmt_side) {
        pmt::comm::all_reduce(world, exec, send, out_pmt);
      } else {
        MPI_Allreduce(send.data(), out_mpi.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      }
      return MPI_Wtime() - t0;
    });
    int ok             = 1;
    const float expect = float(n * (n + 1) / 2);
    for (std::size_t i = 0; i < count; ++i) ok = ok && out_pmt(i) == expect && out_mpi(i) == expect;
    MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    const double alg_p = bytes / slowest[0] / 1e9, alg_m = bytes / slowest[1] / 1e9;
    const double ratio = (alg_p * bus_factor) / (alg_m * bus_factor);
    if (bytes >= (1u << 20)) worst_ratio_large = std::min(worst_ratio_large, ratio);
    if (bytes == 8) lat_pmt = slowest[0], lat_mpi = slowest[1];
    if (r == 0)
      std::printf("%12zu %10zu | %10.2f %9.3f %9.3f | %10.2f %9.3f %9.3f | %8.2f %s\n", bytes, count, slowest[0] * 1e6,
                  alg_p, alg_p * bus_factor, slowest[1] * 1e6, alg_m, alg_m * bus_factor, ratio, ok ? "ok" : "WRONG");
  }
  if (r == 0) {
    std::printf("\n(algbw, busbw in GB/s; busbw = algbw * 2(n-1)/n; time = slowest rank's median)\n");
    std::printf("latency of an 8-byte all-reduce: pmt %.2f us, MPI %.2f us\n", lat_pmt * 1e6, lat_mpi * 1e6);
  }
  // reduce-scatter (ZeRO's gradients, sequence parallelism's rows): pmt::comm::reduce_scatter
  // against MPI_Reduce_scatter_block, the same way; S = the whole buffer, each rank keeps S / n
  if (r == 0)
    std::printf("\nreduce-scatter, float sum, out of place\n%12s | %10s %9s | %10s %9s | %8s %s\n", "size(B)", "pmt us",
                "algbw", "MPI us", "algbw", "MPI/pmt", "check");
  double worst_rs = 1e9;
  for (std::size_t bytes = std::size_t(64) << 10; bytes <= max_bytes; bytes *= 4) {
    const std::size_t count = bytes / sizeof(float) / std::size_t(n) * std::size_t(n), block = count / std::size_t(n);
    Kokkos::View<float*, Kokkos::LayoutRight, Exec::memory_space> send("send", count), out_pmt("out_pmt", block),
        out_mpi("out_mpi", block);
    Kokkos::deep_copy(send, float(r + 1));
    const int rounds   = bytes <= (4u << 20) ? 40 : 10;
    const auto slowest = slowest_medians(rounds, [&](bool pmt_side) {
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = MPI_Wtime();
      if (pmt_side)
        pmt::comm::reduce_scatter(world, exec, send, out_pmt);
      else
        MPI_Reduce_scatter_block(send.data(), out_mpi.data(), static_cast<int>(block), MPI_FLOAT, MPI_SUM,
                                 MPI_COMM_WORLD);
      return MPI_Wtime() - t0;
    });
    int ok             = 1;
    const float expect = float(n * (n + 1) / 2);
    for (std::size_t i = 0; i < block; ++i) ok = ok && out_pmt(i) == expect && out_mpi(i) == expect;
    MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    const double ratio = slowest[1] / slowest[0];
    if (bytes >= (4u << 20)) worst_rs = std::min(worst_rs, ratio);
    if (r == 0)
      std::printf("%12zu | %10.2f %9.3f | %10.2f %9.3f | %8.2f %s\n", count * sizeof(float), slowest[0] * 1e6,
                  double(count * sizeof(float)) / slowest[0] / 1e9, slowest[1] * 1e6,
                  double(count * sizeof(float)) / slowest[1] / 1e9, ratio, ok ? "ok" : "WRONG");
  }
  if (r == 0) {
    pmt::bench::target_line("allreduce_busbw_vs_mpi_at_1MiB_and_up_np" + std::to_string(n), worst_ratio_large, 0.95);
    // pmt's reduce-scatter at least as fast as MPI's from 4 MiB (its ring from 3 ranks, MPI's below)
    pmt::bench::target_line("reduce_scatter_speed_vs_mpi_at_4MiB_and_up_np" + std::to_string(n), worst_rs, 0.95);
  }
  return 0;
}
