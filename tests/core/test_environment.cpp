// SPDX-License-Identifier: Apache-2.0
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include "pmt/pmt.hpp"
#include "pmt_test.hpp"

#include <cstdio>
#include <cstdlib>
#include <string>

using Catch::Matchers::ContainsSubstring;

TEST_CASE("ScopeGuard initialised Kokkos and recorded the world", "[core][environment][mpi]") {
  CHECK(Kokkos::is_initialized());
#if PMT_ENABLE_MPI
  int rank = -1, size = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  CHECK(pmt::world_rank() == rank);
  CHECK(pmt::world_size() == size);
#else
  CHECK(pmt::world_rank() == 0);
  CHECK(pmt::world_size() == 1);
#endif
}

TEST_CASE("each rank of a node takes its own GPU unless the launch names one", "[core][environment][mpi]") {
  // the rule a CUDA build's ScopeGuard applies before Kokkos starts (KOKKOS_DEVICE_ID)
  CHECK(pmt::device_for_local_rank(0, 4) == 0);
  CHECK(pmt::device_for_local_rank(3, 4) == 3);
  CHECK(pmt::device_for_local_rank(5, 4) == 1);  // more ranks than GPUs: shared in turn
  CHECK(pmt::device_for_local_rank(2, 0) == -1);
  const char* none[]  = {"prog", "--steps", "3", nullptr};
  const char* id[]    = {"prog", "--kokkos-device-id=1", nullptr};
  const char* by[]    = {"prog", "--kokkos-map-device-id-by", "random", nullptr};
  const char* other[] = {"prog", "--kokkos-device-idx=1", nullptr};
  const bool env      = std::getenv("KOKKOS_DEVICE_ID") != nullptr || std::getenv("KOKKOS_NUM_DEVICES") != nullptr;
  CHECK(pmt::kokkos_device_named(3, none) == env);
  CHECK(pmt::kokkos_device_named(2, id));
  CHECK(pmt::kokkos_device_named(3, by));
  CHECK(pmt::kokkos_device_named(2, other) == env);
#if PMT_ENABLE_MPI
  // one node here: the node-local rank is the world rank
  const auto [local, on_node] = pmt::detail::node_local_rank();
  CHECK(local == pmt::world_rank());
  CHECK(on_node == pmt::world_size());
#endif
}

TEST_CASE("OMP_WAIT_POLICY=passive with several threads is warned about, nothing else", "[core][environment]") {
  CHECK(pmt::detail::wait_policy_warning(nullptr, 2).empty());
  CHECK(pmt::detail::wait_policy_warning("active", 2).empty());
  CHECK(pmt::detail::wait_policy_warning("PASSIVE", 1).empty());  // one thread never waits for another
  const std::string w = pmt::detail::wait_policy_warning("PASSIVE", 4);
  CHECK_THAT(w, ContainsSubstring("OMP_WAIT_POLICY=PASSIVE"));
  CHECK_THAT(w, ContainsSubstring("4 OpenMP threads"));
  CHECK_THAT(pmt::detail::wait_policy_warning("passive", 2), ContainsSubstring("Unset it"));
}

TEST_CASE("environment_report names Kokkos, the spaces and every backend", "[core][environment]") {
  const std::string report = pmt::environment_report();
  CHECK_THAT(report, ContainsSubstring("Kokkos"));
  CHECK_THAT(report, ContainsSubstring(std::string("default: ") + Kokkos::DefaultExecutionSpace::name()));
  CHECK_THAT(report, ContainsSubstring("MPI"));
  CHECK_THAT(report, ContainsSubstring("BLAS"));
  CHECK_THAT(report, ContainsSubstring("CUDA"));
  CHECK_THAT(report, ContainsSubstring("NCCL"));
#if PMT_ENABLE_MPI
  CHECK_THAT(report, ContainsSubstring(std::to_string(pmt::world_size()) + " rank(s)"));
#endif
#if PMT_ENABLE_CBLAS && PMT_CBLAS_MKL  // a build against MKL (scripts/test_mkl.sh) says so
  CHECK_THAT(report, ContainsSubstring("Math Kernel Library"));
  CHECK(pmt::detail::blas_threads() >= 1);
#elif PMT_ENABLE_CBLAS && PMT_HAVE_OPENBLAS_INFO
  CHECK_THAT(report, ContainsSubstring("OpenBLAS, core "));
#endif
}

// The OpenBLAS of scripts/openblas.sh (0.3.29, what scripts/build.sh links on x86-64) chooses its
// kernels by the CPU's vector ISA where it does not know the model; Debian 12's 0.3.21 ran its
// generic ones on some Xeons. Older OpenBLAS builds and a forced OPENBLAS_CORETYPE are not held to it.
TEST_CASE("an OpenBLAS of 0.3.29 or newer runs vector kernels on a vector CPU", "[core][environment][blas]") {
#if PMT_ENABLE_CBLAS && PMT_HAVE_OPENBLAS_INFO && defined(__GNUC__) && defined(__x86_64__)
  const std::string config = openblas_get_config();  // "OpenBLAS 0.3.29 NO_LAPACK ... DYNAMIC_ARCH ..."
  const std::string core   = pmt::detail::blas_core_name();
  int major = 0, minor = 0, patch = 0;
  REQUIRE(std::sscanf(config.c_str(), "OpenBLAS %d.%d.%d", &major, &minor, &patch) == 3);
  INFO(config << "; core " << core);
  const bool recent = major > 0 || minor > 3 || (minor == 3 && patch >= 29);
  if (!recent || std::getenv("OPENBLAS_CORETYPE") != nullptr) return;
  CHECK_FALSE(pmt::detail::blas_core_is_generic_on_vector_cpu());
  if (config.find("DYNAMIC_ARCH") == std::string::npos) return;  // a build for one CPU: its own choice
  if (__builtin_cpu_supports("avx512f")) {
    CHECK((core == "SkylakeX" || core == "Cooperlake" || core == "SapphireRapids"));
  } else if (__builtin_cpu_supports("avx2")) {
    CHECK((core == "Haswell" || core == "Zen"));
  }
#endif
}

TEST_CASE("a parallel_reduce runs on every enabled space on every rank", "[core][environment][mpi]") {
  long total = 0;
  Kokkos::parallel_reduce(
      "pmt::test::sum", Kokkos::RangePolicy<Kokkos::DefaultHostExecutionSpace>(0, 1000),
      KOKKOS_LAMBDA(int i, long& acc) { acc += i; }, total);
  REQUIRE(pmt::test::all_ranks(total == 499500));
}

TEST_CASE("ScopeGuard flushes denormals to zero on the host threads it starts", "[core][environment][denormals]") {
#if defined(__x86_64__) || defined(__i386__)
  const char* keep  = std::getenv("PMT_DENORMALS");
  const bool expect = !keep || std::string(keep) != "keep";
  // every host thread of Kokkos inherited the main thread's setting (a host lambda: the flag is the
  // host CPU's, and a Kokkos::Cuda build must not compile the call for the device)
  using Host  = Kokkos::DefaultHostExecutionSpace;
  int flushed = 0;
  Kokkos::parallel_reduce(
      "flushed", Kokkos::RangePolicy<Host>(0, 4 * Host().concurrency()),
      [=](int, int& n) { n += pmt::denormals_flushed() ? 1 : 0; }, flushed);
  CHECK(pmt::denormals_flushed() == expect);
  CHECK(flushed == (expect ? 4 * Host().concurrency() : 0));
  // and it does what it says: a product below the smallest normal float is zero, a denormal input
  // counts as zero
  volatile float small = 1e-30f, tiny = 1e-10f;
  const float product = small * tiny;  // 1e-40: denormal
  CHECK((product == 0.0f) == expect);
  CHECK(pmt::flush_denormals(false));
  CHECK(!pmt::denormals_flushed());
  const float kept = small * tiny;
  CHECK(kept > 0.0f);
  CHECK(pmt::flush_denormals(expect));  // as it was
  CHECK_THAT(pmt::environment_report(), ContainsSubstring(expect ? "flushed to zero on the host" : "kept (IEEE"));
#else
  CHECK(!pmt::flush_denormals());
#endif
}
