// SPDX-License-Identifier: Apache-2.0
#pragma once
// The communicators the comm tests run on: the MPI world (when pmt has MPI) and Self.
#include "pmt/comm/collectives.hpp"
#include "pmt/comm/communicator.hpp"
#include "pmt/comm/mesh.hpp"
#include "pmt/comm/mpi.hpp"
#include "pmt_test.hpp"

#include <unistd.h>

#include <filesystem>
#include <string>

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

/// A path every rank of `w` agrees on (it names rank 0's process id) under the temporary
/// directory, for files the ranks share; the caller creates and removes it.
inline std::string shared_temp_path(const World& w, const std::string& stem) {
  Kokkos::View<long long*, Kokkos::HostSpace> id("pmt::test::pid", 1);
  id(0) = static_cast<long long>(getpid());
  pmt::comm::broadcast(w, Kokkos::DefaultHostExecutionSpace(), id, 0);
  return (std::filesystem::temp_directory_path() / (stem + "-" + std::to_string(id(0)))).string();
}

}  // namespace pmt::test
