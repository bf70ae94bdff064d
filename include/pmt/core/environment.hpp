// SPDX-License-Identifier: Apache-2.0
#pragma once
// The process environment: ScopeGuard (MPI_Init if enabled -> Kokkos::initialize, reversed on
// exit) and environment_report(), which says what this build and this machine provide: Kokkos
// version and execution spaces, MPI ranks, the BLAS and the core it runs, CUDA devices, NCCL.
// Denormal floats: on x86 ScopeGuard sets flush-to-zero and denormals-are-zero (MXCSR FTZ, DAZ)
// on the calling thread before it starts Kokkos, whose host threads inherit them, as deep-learning
// CPU back ends commonly do: values below 1.2e-38 (float) then count as zero instead of taking a
// microcode assist of ~100 cycles per operation. A training run whose attention saturates or whose
// gradients underflow otherwise slows down by a third and more, with losses that differ only
// below that size (a DiLoCo run of the main job: 30.1 -> 19.6 ms per step, the same losses bit for
// bit). PMT_DENORMALS=keep keeps IEEE gradual underflow; flush_denormals() sets it on a thread of
// the user's (ScopeGuard leaves a Kokkos the user started before it alone).
//
// This header and comm/mpi.hpp are the only ones that include <mpi.h>; the backend headers
// (<cblas.h>, <cuda_runtime.h>, <nccl.h>) are included only when the build enabled them.

#include "pmt/config.hpp"
#include "pmt/core/error.hpp"
#include "pmt/version.hpp"

#include <Kokkos_Core.hpp>

#if PMT_ENABLE_MPI
#include <mpi.h>
#endif
#include "pmt/detail/cblas.hpp"  // <cblas.h> or MKL's <mkl_cblas.h>, where the build has a CBLAS
#if PMT_ENABLE_CUDA
#include <cuda_runtime_api.h>
#endif
#if PMT_ENABLE_NCCL
#include <nccl.h>
#endif

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <type_traits>

namespace pmt::detail {

/// OpenBLAS' name for the kernels it runs ("SkylakeX", "Haswell", "Prescott"), or "" when the
/// BLAS is not OpenBLAS or pmt was built without one.
inline std::string blas_core_name() {
#if PMT_ENABLE_CBLAS && PMT_HAVE_OPENBLAS_INFO
  const char* core = openblas_get_corename();
  return core ? std::string(core) : std::string();
#else
  return {};
#endif
}

/// True when OpenBLAS fell back to generic kernels on a CPU that has AVX2/AVX-512 (Debian's
/// OpenBLAS 0.3.21 does this on Sapphire Rapids: about 8x slower matmul).
inline bool blas_core_is_generic_on_vector_cpu() {
  const std::string core = blas_core_name();
  if (core.empty()) return false;
  const bool generic = core == "Prescott" || core == "Core2" || core == "Nehalem" || core == "Atom" ||
                       core == "Barcelona" || core == "Katmai" || core == "generic";
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
  return generic && (__builtin_cpu_supports("avx2") || __builtin_cpu_supports("avx512f"));
#else
  return false;
#endif
}

/// OpenBLAS' thread count (0 when unknown). OpenBLAS sizes its pool from the calling thread's
/// affinity mask: with OMP_PROC_BIND that is one core, and vendor matmuls then run on one thread.
inline int blas_threads() {
#if PMT_ENABLE_CBLAS && PMT_HAVE_OPENBLAS_INFO
  return openblas_get_num_threads();
#elif PMT_ENABLE_CBLAS && PMT_CBLAS_MKL
  return mkl_get_max_threads();
#else
  return 0;
#endif
}

/// The warning for an OMP_WAIT_POLICY of `policy` (nullptr: unset) when the host space runs
/// `host_threads` OpenMP threads, or "" when there is nothing to warn about. With "passive",
/// libgomp's threads sleep at the end of every parallel loop instead of spinning, and each of
/// the step's hundreds of loops then starts by waking them: bench_train_step at width 256 took
/// 178-199 ms against 121-138 ms with the default (2 threads, four alternating pairs).
inline std::string wait_policy_warning(const char* policy, int host_threads) {
  if (policy == nullptr || host_threads < 2) return {};
  std::string p(policy);
  for (auto& ch : p) ch = static_cast<char>(ch >= 'A' && ch <= 'Z' ? ch - 'A' + 'a' : ch);
  if (p != "passive") return {};
  return "pmt: warning: OMP_WAIT_POLICY=" + std::string(policy) + " makes the " + std::to_string(host_threads) +
         " OpenMP threads sleep after every parallel loop, and pmt runs hundreds of short loops per "
         "training step (about 1.5x slower at width 256). Unset it, or set it to active, unless "
         "the cores are shared with other work.\n";
}

inline void warn_about_environment(int rank) {
  if (rank != 0) return;
  const int host_threads = Kokkos::DefaultHostExecutionSpace().concurrency();
#ifdef KOKKOS_ENABLE_OPENMP
  if (std::is_same_v<Kokkos::DefaultHostExecutionSpace, Kokkos::OpenMP>) {
    const std::string w = wait_policy_warning(std::getenv("OMP_WAIT_POLICY"), host_threads);
    if (!w.empty()) std::fputs(w.c_str(), stderr);
  }
#endif
  if (PMT_HAVE_OPENBLAS_INFO && blas_threads() > 0 && blas_threads() < host_threads)
    std::fprintf(stderr,
                 "pmt: warning: OpenBLAS uses %d thread(s) but Kokkos' host space has %d, so "
                 "vendor matmuls use fewer cores. OpenBLAS counted the cores the main thread may "
                 "run on, which OMP_PROC_BIND pins (OPENBLAS_NUM_THREADS cannot raise it then). "
                 "Call openblas_set_num_threads(%d) after pmt::ScopeGuard, or run with "
                 "OMP_PROC_BIND=false.\n",
                 blas_threads(), host_threads, host_threads);
#if PMT_ENABLE_CBLAS
  if (!cblas_sgemm_row_major_ok())
    std::fprintf(stderr,
                 "pmt: warning: the BLAS computed a wrong 8x8x8 row-major sgemm in pmt's check "
                 "(OpenBLAS core '%s'%s%s): OpenBLAS 0.3.29 runs small row-major products through "
                 "an AVX-512 kernel that the kernels it was told to use (OPENBLAS_CORETYPE) do not "
                 "have. pmt calls sgemm in column-major form, which is correct; unset "
                 "OPENBLAS_CORETYPE or name an AVX-512 core (SkylakeX) for other programs.\n",
                 blas_core_name().c_str(), std::getenv("OPENBLAS_CORETYPE") ? ", OPENBLAS_CORETYPE=" : "",
                 std::getenv("OPENBLAS_CORETYPE") ? std::getenv("OPENBLAS_CORETYPE") : "");
#endif
  if (!blas_core_is_generic_on_vector_cpu()) return;
  std::fprintf(stderr,
               "pmt: note: OpenBLAS runs its generic '%s' kernels on this CPU, which has AVX2/AVX-512, "
               "so its matmul is several times slower than it could be. pmt's matmul times OpenBLAS "
               "against its own portable kernel per shape class and takes the faster (PMT_MATMUL=auto, "
               "the default). OPENBLAS_CORETYPE naming the CPU's own kernels (SkylakeX on AVX-512, Haswell "
               "on AVX2 only) gives this OpenBLAS its speed back; OpenBLAS 0.3.29 (scripts/openblas.sh builds it, "
               "scripts/build.sh "
               "links it) takes the kernels of the CPU's vector ISA on a model it does not know.\n",
               blas_core_name().c_str());
}

}  // namespace pmt::detail

namespace pmt {

// x86 hosts (GCC and Clang) have the MXCSR control register; device passes and other targets not.
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__) && !defined(__CUDA_ARCH__)
#define PMT_HAVE_MXCSR 1
#else
#define PMT_HAVE_MXCSR 0
#endif
namespace detail {
inline constexpr unsigned mxcsr_ftz_daz = 0x8040u;  // FTZ (bit 15) and DAZ (bit 6)
}  // namespace detail

/// \brief Sets (or with `on` false clears) flush-to-zero and denormals-are-zero for this thread's
/// SSE/AVX arithmetic (x86 MXCSR; threads it creates later inherit it). Returns false where the
/// target has no such control (nothing changes).
inline bool flush_denormals(bool on = true) noexcept {
#if PMT_HAVE_MXCSR
  constexpr unsigned ftz_daz = detail::mxcsr_ftz_daz;
  const unsigned csr         = __builtin_ia32_stmxcsr();
  __builtin_ia32_ldmxcsr(on ? (csr | ftz_daz) : (csr & ~ftz_daz));
  return true;
#else
  (void)on;
  return false;
#endif
}

/// \brief Whether this thread flushes denormals to zero (x86: MXCSR FTZ and DAZ both set).
inline bool denormals_flushed() noexcept {
#if PMT_HAVE_MXCSR
  return (__builtin_ia32_stmxcsr() & detail::mxcsr_ftz_daz) == detail::mxcsr_ftz_daz;
#else
  return false;
#endif
}

// ---------------------------------------------------------------------------------------------

/// \brief RAII environment: MPI_Init_thread (if pmt was built with MPI and MPI is not yet
/// initialized) then Kokkos::initialize (if not yet initialized); the destructor undoes only
/// what the constructor did, in reverse order.
///
/// On x86 it flushes denormals to zero first (see the file comment; PMT_DENORMALS=keep does not).
/// It records this process' world rank for error messages and warns once (rank 0) when OpenBLAS
/// runs generic kernels on a vector CPU or fewer threads than Kokkos, and when OMP_WAIT_POLICY is
/// passive with several OpenMP threads. When the guard is destroyed while an exception is in
/// flight in a multi-rank job, it calls MPI_Abort so the other ranks end instead of hanging.
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
    int mpi_ready = 0;
    MPI_Initialized(&mpi_ready);
    if (!mpi_ready) {
      int provided = 0;
      // Only the thread that called Kokkos talks to MPI (Kokkos' OpenMP workers never do).
      if (MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
        throw CommError("pmt::ScopeGuard", "MPI_Init_thread failed");
      m_owns_mpi = true;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &detail::process_context().rank);
    MPI_Comm_size(MPI_COMM_WORLD, &detail::process_context().size);
#endif
    if (!Kokkos::is_initialized()) {
      const char* denormals = std::getenv("PMT_DENORMALS");
      if (!denormals || std::string(denormals) != "keep") flush_denormals();  // Kokkos' threads inherit it
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
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
#endif
    if (m_owns_kokkos && Kokkos::is_initialized()) Kokkos::finalize();
#if PMT_ENABLE_MPI
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (m_owns_mpi && !finalized) MPI_Finalize();
#endif
  }

  ScopeGuard(const ScopeGuard&)            = delete;
  ScopeGuard& operator=(const ScopeGuard&) = delete;

 private:
  bool m_owns_mpi    = false;
  bool m_owns_kokkos = false;
  int m_uncaught     = 0;
};

/// \brief This process' rank in the world (0 without MPI) and the world size (1 without MPI).
inline int world_rank() noexcept { return detail::process_context().rank; }
inline int world_size() noexcept { return detail::process_context().size; }

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
  char lib[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(lib, &len);
  std::string libstr(lib, static_cast<std::size_t>(len));
  libstr = libstr.substr(0, libstr.find_first_of(",\n"));
  line("MPI", std::to_string(world_size()) + " rank(s), this is rank " + std::to_string(world_rank()) + "; " + libstr);
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
  int devices        = 0;
  cudaError_t status = cudaGetDeviceCount(&devices);
  if (status == cudaSuccess) {
    line("CUDA", std::to_string(devices) + " device(s)");
  } else {
    line("CUDA", std::string("runtime linked, no usable device: ") + cudaGetErrorString(status));
  }
#else
  line("CUDA", "not enabled");
#endif
#if PMT_ENABLE_NCCL
  int nccl_version = 0;
  ncclGetVersion(&nccl_version);
  line("NCCL", std::to_string(nccl_version / 10000) + "." + std::to_string(nccl_version / 100 % 100) + "." +
                   std::to_string(nccl_version % 100) + " linked");
#else
  line("NCCL", "not enabled");
#endif
  return out;
}

}  // namespace pmt
