// SPDX-License-Identifier: Apache-2.0
// The test main for every pmt test binary: ScopeGuard (MPI_Init if enabled -> Kokkos) -> one Catch2
// session per rank -> every rank's verdict combined, so one failing rank fails the whole run.
//
// - Rank 0 reports to stdout; rank r > 0 writes its report to <binary>.np<size>.rank<r>.log in the
//   working directory (or $PMT_TEST_LOG_DIR), and rank 0 names the ranks that failed.
// - The random seed is rank 0's on every rank (Catch2 picks a fresh one per run by default).
// - Catch2 v3 already fails a run that executed no test (exit 2): a filter that matches nothing
//   cannot pass silently.

#include <catch2/catch_session.hpp>

#include "pmt/comm/process.hpp"

#if PMT_ENABLE_MPI
#include <mpi.h>  // the harness talks to MPI directly
#endif

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

std::string base_name(const char* path) {
  std::string s(path);
  const auto slash = s.find_last_of('/');
  return slash == std::string::npos ? s : s.substr(slash + 1);
}

}  // namespace

int main(int argc, char* argv[]) {
  pmt::ScopeGuard guard(argc, argv);
  const int rank = pmt::world_rank();
  const int size = pmt::world_size();

  Catch::Session session;
  if (const int rc = session.applyCommandLine(argc, argv); rc != 0) return rc;

  std::string log_name;
  if (rank != 0) {
    const char* dir = std::getenv("PMT_TEST_LOG_DIR");
    log_name = (dir ? std::string(dir) + "/" : std::string()) + base_name(argv[0]) + ".np" + std::to_string(size) +
               ".rank" + std::to_string(rank) + ".log";
    session.configData().defaultOutputFilename = log_name;
  }
#if PMT_ENABLE_MPI
  unsigned seed = session.configData().rngSeed;
  MPI_Bcast(&seed, 1, MPI_UNSIGNED, 0, MPI_COMM_WORLD);
  session.configData().rngSeed = seed;
#endif

  const int local_rc = session.run();

#if PMT_ENABLE_MPI
  std::vector<int> all_rc(static_cast<std::size_t>(size), 0);
  MPI_Allgather(&local_rc, 1, MPI_INT, all_rc.data(), 1, MPI_INT, MPI_COMM_WORLD);
  int combined = 0;
  std::string failed;
  for (int r = 0; r < size; ++r) {
    if (all_rc[static_cast<std::size_t>(r)] != 0) {
      combined = combined != 0 ? combined : all_rc[static_cast<std::size_t>(r)];
      failed += ' ';  // not " " + std::to_string(r): GCC 12 warns falsely in C++20 (-Wrestrict)
      failed += std::to_string(r);
    }
  }
  if (rank == 0 && size > 1) {
    if (failed.empty()) {
      std::printf("pmt test harness: all %d ranks passed\n", size);
    } else {
      std::printf("pmt test harness: ranks that failed:%s (reports of ranks > 0 in %s.np%d.rank<r>.log)\n",
                  failed.c_str(), base_name(argv[0]).c_str(), size);
    }
    std::fflush(stdout);
  }
  return combined;
#else
  return local_rc;
#endif
}
