// SPDX-License-Identifier: Apache-2.0
#pragma once
// Part of the run harness (pmt/run.hpp): programs include it; the library never does.
// choose_threads: the OpenMP threads of a rank, before Kokkos starts. An explicit count wins; with
// none and OMP_NUM_THREADS unset, ranks that share a node's cores get their share of them (each
// with every core's worth of threads, they would thrash).

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

/// Sets this rank's OpenMP threads, before Kokkos is initialised: `requested` when > 0 (the
/// user's choice), else a share of the node when several ranks share it and OMP_NUM_THREADS is
/// unset, else nothing. The OpenMP runtime read OMP_NUM_THREADS when it was loaded, so the count
/// goes to it directly (omp_set_num_threads, which Kokkos and an OpenMP BLAS follow) and to the
/// environment. Returns a line saying what a share chose (empty otherwise), naming `flag`.
/// \throws pmt::ConfigError when `requested` is above max_threads().
inline std::string choose_threads(int requested, const std::string& flag = "--threads") {
  const auto set = [](int n) {
    setenv("OMP_NUM_THREADS", std::to_string(n).c_str(), 1);
#if defined(_OPENMP)
    omp_set_num_threads(n);
#endif
  };
  if (requested > max_threads())
    throw ConfigError("pmt::run::choose_threads", pmt::detail::str(flag, " ", requested, ": at most ", max_threads(),
                                                                   " (4 per core of this node)"));
  if (requested > 0) {
    set(requested);
    return {};
  }
  if (std::getenv("OMP_NUM_THREADS") != nullptr || local_ranks() <= 1) return {};
  cpu_set_t cpus;
  const int online = static_cast<int>(std::thread::hardware_concurrency());
  const int mine   = sched_getaffinity(0, sizeof cpus, &cpus) == 0 ? CPU_COUNT(&cpus) : online;
  const int ranks  = local_ranks();
  const int n      = mine < online ? std::max(1, mine) : std::max(1, online / ranks);
  set(n);
  return pmt::detail::str("threads: ", n, " per rank (OMP_NUM_THREADS unset: ",
                          mine < online ? pmt::detail::str("the ", mine, " core(s) this rank is bound to")
                                        : pmt::detail::str(online, " cores / ", ranks, " ranks on this node"),
                          "; ", flag, " N sets it)");
}

}  // namespace pmt::run
