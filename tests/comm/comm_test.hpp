// SPDX-License-Identifier: Apache-2.0
#pragma once
// The communicators the comm tests run on: the MPI world (when pmt has MPI) and Self.
#include "pmt/comm/collectives.hpp"
#include "pmt/comm/communicator.hpp"
#include "pmt/comm/mesh.hpp"
#include "pmt/comm/mpi.hpp"
#include "pmt_test.hpp"

namespace pmt::test {

#if PMT_ENABLE_MPI
using World = pmt::comm::Communicator<pmt::comm::Mpi>;
inline World& world() {
  static World w(MPI_COMM_WORLD);
  return w;
}
#else
using World = pmt::comm::Communicator<pmt::comm::Self>;
inline World& world() {
  static World w;
  return w;
}
#endif

}  // namespace pmt::test
