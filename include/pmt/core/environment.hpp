// SPDX-License-Identifier: Apache-2.0
#pragma once
// The host environment, without any communication backend: the world rank and size recorded for
// error messages (world_rank(), world_size()), the BLAS this build links and the core it runs,
// the warnings about OpenMP and BLAS settings, and denormal floats. The process' lifetime
// (ScopeGuard: MPI_Init -> Kokkos::initialize) and environment_report() are in comm/process.hpp,
// which reaches MPI, CUDA and NCCL through the headers that implement them.
// Denormal floats: on x86 ScopeGuard sets flush-to-zero and denormals-are-zero (MXCSR FTZ, DAZ)
// on the calling thread before it starts Kokkos, whose host threads inherit them, as deep-learning
// CPU back ends commonly do: values below 1.2e-38 (float) then count as zero instead of taking a
// microcode assist of ~100 cycles per operation. A training run whose attention saturates or whose
// gradients underflow otherwise slows down by a third and more, with losses that differ only
// below that size (a DiLoCo run of the main job: 30.1 -> 19.6 ms per step, the same losses bit for
// bit). PMT_DENORMALS=keep keeps IEEE gradual underflow; flush_denormals() sets it on a thread of
// the user's (ScopeGuard leaves a Kokkos the user started before it alone).

#include "pmt/config.hpp"
#include "pmt/core/error.hpp"
#include "pmt/detail/cblas.hpp"  // <cblas.h> or MKL's <mkl_cblas.h>, where the build has a CBLAS

#include <Kokkos_Core.hpp>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <initializer_list>
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

/// \brief This process' rank in the world (0 without MPI) and the world size (1 without MPI).
inline int world_rank() noexcept { return detail::process_context().rank; }
inline int world_size() noexcept { return detail::process_context().size; }

/// \brief The GPU a rank takes on its node: its node-local rank modulo the node's devices, so the
/// ranks of a node spread over its GPUs in rank order; -1 when there is no device.
inline int device_for_local_rank(int local_rank, int devices) noexcept {
  return devices > 0 && local_rank >= 0 ? local_rank % devices : -1;
}

/// \brief Whether the command line or the environment already says which device Kokkos takes
/// (--kokkos-device-id, --kokkos-map-device-id-by, --kokkos-num-devices and their old spellings;
/// KOKKOS_DEVICE_ID, KOKKOS_NUM_DEVICES): then pmt leaves the choice to Kokkos.
inline bool kokkos_device_named(int argc, const char* const* argv) {
  for (const char* env : {"KOKKOS_DEVICE_ID", "KOKKOS_NUM_DEVICES"})
    if (std::getenv(env) != nullptr) return true;
  for (int i = 1; i < argc && argv[i] != nullptr; ++i) {
    const std::string a = argv[i];
    for (const char* flag : {"--kokkos-device-id", "--kokkos-map-device-id-by", "--kokkos-num-devices",
                             "--kokkos-ndevices", "--kokkos-device", "--device-id", "--num-devices", "--ndevices"})
      if (a == flag || a.rfind(std::string(flag) + "=", 0) == 0) return true;
  }
  return false;
}

}  // namespace pmt
