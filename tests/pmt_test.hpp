// SPDX-License-Identifier: Apache-2.0
#pragma once
// Helpers shared by pmt's tests: the enabled execution spaces as a type list, tolerances, and
// all_ranks() so a check that involves other ranks is decided together (never let one rank
// REQUIRE-fail before a collective the others will enter).

#include "pmt/config.hpp"
#include "pmt/core/environment.hpp"

#include <Kokkos_Core.hpp>

#if PMT_ENABLE_MPI
#include <mpi.h>
#endif

#include <cmath>
#include <limits>
#include <tuple>

namespace pmt::test {

/// The host execution spaces this Kokkos enables (TEMPLATE_LIST_TEST_CASE over them).
using ExecSpaces = std::tuple<
#ifdef KOKKOS_ENABLE_OPENMP
    Kokkos::OpenMP
#ifdef KOKKOS_ENABLE_SERIAL
    ,
#endif
#endif
#ifdef KOKKOS_ENABLE_SERIAL
    Kokkos::Serial
#endif
    >;

/// True on every rank iff `ok` is true on every rank (a collective: call it on all ranks).
inline bool all_ranks(bool ok) {
#if PMT_ENABLE_MPI
  int local = ok ? 1 : 0, global = 0;
  MPI_Allreduce(&local, &global, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return global == 1;
#else
  return ok;
#endif
}

/// Relative tolerance for a result accumulated over k terms in type T.
template <class T>
T tol(double k = 1.0) {
  return static_cast<T>(std::max(1.0, std::sqrt(k)) * 8.0 * static_cast<double>(std::numeric_limits<T>::epsilon()));
}

}  // namespace pmt::test
