// SPDX-License-Identifier: Apache-2.0
// Hidden cases that exercise the test harness itself; ctest runs them by tag and expects failure:
//   [.harness_fail_one_rank]  fails on the last rank only: the whole run must fail.
//   [.harness_hang]           rank 0 waits for a message nobody sends: the launcher's timeout
//                             must end the job.
#include <catch2/catch_test_macros.hpp>

#include "pmt/core/environment.hpp"

#if PMT_ENABLE_MPI
#include <mpi.h>  // the harness talks to MPI directly
#endif

TEST_CASE("a check that fails on the last rank only", "[.harness_fail_one_rank]") {
  CHECK(pmt::world_rank() != pmt::world_size() - 1);
}

TEST_CASE("rank 0 waits for a message that never comes", "[.harness_hang]") {
#if PMT_ENABLE_MPI
  if (pmt::world_rank() == 0) {
    int value = 0;
    MPI_Recv(&value, 1, MPI_INT, MPI_ANY_SOURCE, 999, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  }
#else
  for (;;) {
  }
#endif
  SUCCEED();
}
