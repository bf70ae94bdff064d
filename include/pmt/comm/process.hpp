// SPDX-License-Identifier: Apache-2.0
#pragma once
// The process: ScopeGuard (MPI_Init if enabled -> Kokkos::initialize, reversed on exit) and
// environment_report(), which says what this build and this machine provide: Kokkos version and
// execution spaces, MPI ranks, the BLAS and the core it runs, CUDA devices, NCCL. The backends
// are reached through the headers that implement them (comm/mpi.hpp, comm/nccl.hpp,
// detail/cuda_runtime.hpp); core/environment.hpp holds what needs none of them.

#include "pmt/config.hpp"
#include "pmt/core/environment.hpp"
#include "pmt/core/error.hpp"
#include "pmt/core/failure.hpp"
#include "pmt/detail/cblas.hpp"
#include "pmt/version.hpp"
#if PMT_ENABLE_MPI
#include "pmt/comm/mpi.hpp"
#endif
#if PMT_ENABLE_NCCL && PMT_ENABLE_MPI
#include "pmt/comm/nccl.hpp"
#endif
#if PMT_ENABLE_CUDA
#include "pmt/detail/cuda_runtime.hpp"
#endif

#include <Kokkos_Core.hpp>

#include <stdlib.h>  // setenv
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

namespace pmt {

/// \brief RAII environment: MPI_Init_thread (if pmt was built with MPI and MPI is not yet
/// initialized) then Kokkos::initialize (if not yet initialized); the destructor undoes only
/// what the constructor did, in reverse order.
///
/// On x86 it flushes denormals to zero first (see the file comment; PMT_DENORMALS=keep does not).
/// It records this process' world rank for error messages and warns once (rank 0) when OpenBLAS
/// runs generic kernels on a vector CPU or fewer threads than Kokkos, and when OMP_WAIT_POLICY is
/// passive with several OpenMP threads. In a build with CUDA each rank of a node takes its own
/// GPU (its node-local rank modulo the node's GPUs) unless --kokkos-device-id or KOKKOS_DEVICE_ID
/// says otherwise. When the guard is destroyed while an exception is in
/// flight in a multi-rank job, or after this rank failed (core/failure.hpp: an error left a
/// training step, which the program may have caught), it calls MPI_Abort so the other ranks end
/// instead of hanging (end_job_if_failed).
///
/// \code
/// int main(int argc, char* argv[]) {
///   pmt::ScopeGuard guard(argc, argv);
///   ...
/// }
/// \endcode
/// \throws pmt::CommError when MPI_Init_thread fails.
class ScopeGuard {
 public:
  ScopeGuard(int& argc, char**& argv) {
#if PMT_ENABLE_MPI
    m_owns_mpi = detail::mpi_initialize(argc, argv);
#endif
    if (!Kokkos::is_initialized()) {
      const char* denormals = std::getenv("PMT_DENORMALS");
      if (!denormals || std::string(denormals) != "keep") flush_denormals();  // Kokkos' threads inherit it
#if PMT_ENABLE_MPI && PMT_ENABLE_CUDA && defined(KOKKOS_ENABLE_CUDA)
      pick_device(argc, argv);
#endif
      Kokkos::initialize(argc, argv);
      m_owns_kokkos = true;
    }
    m_uncaught = std::uncaught_exceptions();
    detail::warn_about_environment(detail::process_context().rank);
  }

  ~ScopeGuard() {
#if PMT_ENABLE_MPI
    if (std::uncaught_exceptions() > m_uncaught && detail::process_context().size > 1) {
      std::fprintf(stderr, "pmt: rank %d is unwinding with an exception; aborting the job\n",
                   detail::process_context().rank);
      detail::mpi_abort_world();
    }
    if (m_owns_mpi) end_job_if_failed();
#endif
    if (m_owns_kokkos && Kokkos::is_initialized()) Kokkos::finalize();
#if PMT_ENABLE_MPI
    if (m_owns_mpi) detail::mpi_finalize();
#endif
  }

  ScopeGuard(const ScopeGuard&)            = delete;
  ScopeGuard& operator=(const ScopeGuard&) = delete;

  /// \brief When this rank has failed (pmt::rank_failed()) in a job of several ranks: says so on
  /// stderr, with the rank and the recorded reason, and ends the whole job (MPI_Abort, exit code
  /// 1), because the other ranks may be waiting for it forever. Otherwise nothing. A program that
  /// initialises MPI itself calls it before MPI_Finalize.
  static void end_job_if_failed() {
#if PMT_ENABLE_MPI
    if (!rank_failed() || detail::process_context().size <= 1) return;
    std::fprintf(stderr, "pmt: rank %d of %d failed (%s); the other ranks may wait for it forever: aborting the job\n",
                 detail::process_context().rank, detail::process_context().size, failure_reason().c_str());
    std::fflush(stderr);
    detail::mpi_abort_world();
#endif
  }

 private:
#if PMT_ENABLE_MPI && PMT_ENABLE_CUDA && defined(KOKKOS_ENABLE_CUDA)
  /// A GPU build: the ranks of a node spread over its GPUs by node-local rank (an MPI
  /// shared-memory split; device_for_local_rank), given to Kokkos as KOKKOS_DEVICE_ID, unless the
  /// command line or the environment already names the device (kokkos_device_named).
  static void pick_device(int argc, char** argv) {
    if (kokkos_device_named(argc, argv)) return;
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess) return;
    const int device = device_for_local_rank(detail::node_local_rank().first, devices);
    if (device >= 0) ::setenv("KOKKOS_DEVICE_ID", std::to_string(device).c_str(), 0);
  }
#endif
  bool m_owns_mpi    = false;
  bool m_owns_kokkos = false;
  int m_uncaught     = 0;
};

/// \brief A multi-line, human-readable description of the build and the machine: pmt and
/// Kokkos versions, enabled execution spaces and their concurrency, MPI, BLAS (and the OpenBLAS
/// core it runs), CUDA devices, NCCL. Call after ScopeGuard.
inline std::string environment_report() {
  std::string out;
  auto line = [&out](const std::string& key, const std::string& value) {
    out += "  " + key + std::string(key.size() < 16 ? 16 - key.size() : 1, ' ') + value + "\n";
  };
  line("pmt", version());
  line("Kokkos", std::to_string(KOKKOS_VERSION / 10000) + "." + std::to_string(KOKKOS_VERSION / 100 % 100) + "." +
                     std::to_string(KOKKOS_VERSION % 100));
  std::string spaces;
#ifdef KOKKOS_ENABLE_SERIAL
  spaces += "Serial ";
#endif
#ifdef KOKKOS_ENABLE_OPENMP
  spaces += "OpenMP(" + std::to_string(Kokkos::OpenMP().concurrency()) + " threads) ";
#endif
#ifdef KOKKOS_ENABLE_THREADS
  spaces += "Threads ";
#endif
#ifdef KOKKOS_ENABLE_CUDA
  spaces += "Cuda ";
#endif
  line("exec spaces", spaces + "(default: " + Kokkos::DefaultExecutionSpace::name() + ")");
#if PMT_ENABLE_MPI
  line("MPI", std::to_string(world_size()) + " rank(s), this is rank " + std::to_string(world_rank()) + "; " +
                  detail::mpi_library_version());
#else
  line("MPI", "not enabled (one process)");
#endif
  line("denormals", denormals_flushed() ? "flushed to zero on the host (FTZ/DAZ; PMT_DENORMALS=keep keeps them)"
                                        : "kept (IEEE gradual underflow)");
#if PMT_ENABLE_CBLAS
  std::string blas = "CBLAS enabled";
#if PMT_CBLAS_MKL
  char mkl_version[198] = {};
  mkl_get_version_string(mkl_version, static_cast<int>(sizeof mkl_version) - 1);
  std::string mkl(mkl_version);
  mkl  = mkl.substr(0, mkl.find_first_of("-(", mkl.find("Version")));  // "... Version 2026.2"
  blas = mkl + ", " + std::to_string(detail::blas_threads()) + " thread(s) at most";
#endif
  const std::string core = detail::blas_core_name();
  if (!core.empty()) {
    blas = "OpenBLAS, core " + core + ", " + std::to_string(detail::blas_threads()) + " thread(s)";
    if (detail::blas_core_is_generic_on_vector_cpu())
      blas += " (generic kernels on a vector CPU: set OPENBLAS_CORETYPE)";
  }
  line("BLAS", blas);
  const auto& bf16_gemm = detail::cblas_bf16_gemm();
  line("BLAS bf16", bf16_gemm.fn       ? std::string(bf16_gemm.name) + " (bf16 products time it against pmt's kernels)"
                    : bf16_gemm.failed ? std::string(bf16_gemm.name) + " failed a check of a small product: not used"
                                       : std::string("no bf16 GEMM in this BLAS"));
#else
  line("BLAS", "not enabled (portable Kokkos matmul only)");
#endif
#if PMT_ENABLE_CUDA
  line("CUDA", detail::cuda_device_report());
#else
  line("CUDA", "not enabled");
#endif
#if PMT_ENABLE_NCCL && PMT_ENABLE_MPI
  line("NCCL", detail::nccl_version() + " linked");
#else
  line("NCCL", "not enabled");
#endif
  return out;
}

}  // namespace pmt
