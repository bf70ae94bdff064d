// SPDX-License-Identifier: Apache-2.0
#pragma once
// Part of the run harness (pmt/run.hpp): programs include it; the library never does.
// choose_threads: the OpenMP threads of a rank, before Kokkos starts. An explicit count wins, then
// OMP_NUM_THREADS; with neither, ranks that share a node's cores get their share of them. A count
// that would oversubscribe the node (its ranks x threads > its cores) is capped to the share, and
// said: four ranks of two threads on two cores ran a GPT step 185x slower than one thread each.

#include "pmt/core/error.hpp"

#include <algorithm>
#include <cstdlib>
#include <string>
#include <thread>

#include <sched.h>

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace pmt::run {

/// The number of ranks on this node, from the launcher's environment (1 when unknown).
inline int local_ranks() {
  for (const char* v : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"})
    if (const char* n = std::getenv(v))
      if (std::atoi(n) > 0) return std::atoi(n);
  return 1;
}

/// Whether this process is the job's first rank, from the launcher's environment (before MPI is
/// initialised; true when there is no launcher).
inline bool is_first_rank_env() {
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "PMI_RANK"})
    if (const char* r = std::getenv(v)) return std::atoi(r) == 0;
  return true;
}

/// The most threads a rank may ask for: four per core of the node (more only cost memory).
inline int max_threads() { return 4 * std::max(1, static_cast<int>(std::thread::hardware_concurrency())); }

/// The threads a count that oversubscribes the node becomes: its cores / its ranks (at least
/// 1), when `ranks` x `threads` exceeds `cores`; `threads` otherwise.
inline int fitting_threads(int threads, int ranks, int cores) {
  if (threads <= 1 || static_cast<long>(ranks) * threads <= cores) return threads;
  return std::max(1, std::min(threads, cores / std::max(1, ranks)));
}

/// Sets this rank's OpenMP threads, before Kokkos is initialised: `requested` when > 0 (the
/// user's choice), else OMP_NUM_THREADS as given, else a share of the node when several ranks
/// share it. A count that would oversubscribe the node (its ranks x the count > its cores: spinning
/// OpenMP threads then wait on each other, up to two orders of magnitude slower) is capped to the
/// node's cores / its ranks, unless PMT_OVERSUBSCRIBE=1. The OpenMP runtime read OMP_NUM_THREADS
/// when it was loaded, so the count goes to it directly (omp_set_num_threads, which Kokkos and an
/// OpenMP BLAS follow) and to the environment. Returns a line saying what a share or a cap chose
/// (empty otherwise), naming `flag`.
/// \throws pmt::ConfigError when `requested` is above max_threads().
inline std::string choose_threads(int requested, const std::string& flag = "--threads") {
  const auto set = [](int n) {
    setenv("OMP_NUM_THREADS", std::to_string(n).c_str(), 1);
#if defined(_OPENMP)
    omp_set_num_threads(n);
#endif
  };
  const int online = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  if (requested > max_threads())
    throw ConfigError("pmt::run::choose_threads", pmt::detail::str(flag, " ", requested, ": at most ", max_threads(),
                                                                   " (4 per core; this node has ", online, " cores)"));
  const int ranks       = local_ranks();
  const char* env       = std::getenv("OMP_NUM_THREADS");
  const int given       = requested > 0 ? requested : env ? std::atoi(env) : 0;
  const bool may_exceed = std::getenv("PMT_OVERSUBSCRIBE") && std::string(std::getenv("PMT_OVERSUBSCRIBE")) == "1";
  if (given > 0) {
    const int n = may_exceed ? given : fitting_threads(given, ranks, online);
    if (requested > 0 || n != given) set(n);
    if (n == given) return {};
    return pmt::detail::str("threads: ", n, " per rank instead of ", given, " (",
                            requested > 0 ? flag : "OMP_NUM_THREADS", "): ", ranks, " ranks x ", given,
                            " threads would oversubscribe this node's ", online, " cores; PMT_OVERSUBSCRIBE=1 keeps ",
                            given);
  }
  if (ranks <= 1) return {};
  cpu_set_t cpus;
  const int mine = sched_getaffinity(0, sizeof cpus, &cpus) == 0 ? CPU_COUNT(&cpus) : online;
  const int n    = mine < online ? std::max(1, mine) : std::max(1, online / ranks);
  set(n);
  return pmt::detail::str("threads: ", n, " per rank (OMP_NUM_THREADS unset: ",
                          mine < online ? pmt::detail::str("the ", mine, " core(s) this rank is bound to")
                                        : pmt::detail::str(online, " cores / ", ranks, " ranks on this node"),
                          "; ", flag, " N sets it)");
}

}  // namespace pmt::run
