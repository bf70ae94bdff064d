// SPDX-License-Identifier: Apache-2.0
#pragma once
// The measured fp32 FMA peak of the host threads, for model-FLOPs utilisation (MFU): each thread
// of the default host execution space runs 12 independent vector accumulator chains (enough to
// hide FMA latency on current x86 cores). The vector width is the CPU's, chosen at run time, not
// the build's: on x86-64 the widest of AVX-512F, AVX2 + FMA and SSE2 the CPU has (each kernel is
// compiled for its ISA with a target attribute), so a build without -march=native still measures
// the machine (and MFU does not come out too high). 5 M iterations take about 0.1 s. On a node
// shared by several ranks, measure on all ranks at once and add up.
// The GNU vectors are written `v = {}; v += scalar` rather than `{} + scalar`: CUDA 13's front
// end (cudafe++) crashes on a 64-byte vector plus a scalar in an initialiser.
// On a GPU (peak_gflops<Kokkos::Cuda>) the peak is the device's, from its properties:
// multiprocessors x boost clock x the per-clock rate of its compute capability
// (pmt/detail/cuda_runtime.hpp), for bf16 tensor cores or fp32 lanes.

#include "pmt/config.hpp"
#include "pmt/core/tensor.hpp"
#include "pmt/detail/cuda_runtime.hpp"

#include <Kokkos_Core.hpp>

#include <string>

namespace pmt::obs {

/// \brief The vector ISA a peak measurement uses: its name and fp32 lanes.
struct PeakIsa {
  const char* name = "scalar";
  int lanes        = 1;
};

namespace detail {

constexpr int chains = 12;  // written out in PMT_PEAK_KERNEL's loop

// One thread's chains: fp32 vectors of `Bytes` bytes; returns a sum so nothing is optimised away.
#define PMT_PEAK_KERNEL(NAME, BYTES, TARGET)                                           \
  TARGET inline float NAME(long iters) {                                               \
    typedef float vec __attribute__((vector_size(BYTES)));                             \
    vec acc[chains];                                                                   \
    for (int c = 0; c < chains; ++c) {                                                 \
      acc[c] = vec{};                                                                  \
      acc[c] += float(c) * 1e-9f;                                                      \
    }                                                                                  \
    vec a = vec{}, b = vec{};                                                          \
    a += 0.999999f;                                                                    \
    b += 1e-7f;                                                                        \
    for (long i = 0; i < iters; ++i) { /* unrolled by hand: in registers at -O2 too */ \
      acc[0] = acc[0] * a + b, acc[1] = acc[1] * a + b, acc[2] = acc[2] * a + b;       \
      acc[3] = acc[3] * a + b, acc[4] = acc[4] * a + b, acc[5] = acc[5] * a + b;       \
      acc[6] = acc[6] * a + b, acc[7] = acc[7] * a + b, acc[8] = acc[8] * a + b;       \
      acc[9] = acc[9] * a + b, acc[10] = acc[10] * a + b, acc[11] = acc[11] * a + b;   \
    }                                                                                  \
    float r = 0;                                                                       \
    for (int c = 0; c < chains; ++c)                                                   \
      for (int l = 0; l < (BYTES) / 4; ++l) r += acc[c][l];                            \
    return r;                                                                          \
  }

#if defined(__x86_64__) && defined(__GNUC__)
PMT_PEAK_KERNEL(chains_avx512, 64, __attribute__((target("avx512f,fma"))))
PMT_PEAK_KERNEL(chains_avx2, 32, __attribute__((target("avx2,fma"))))
#endif
PMT_PEAK_KERNEL(chains_base, 16, )
#undef PMT_PEAK_KERNEL

/// 0: AVX-512F, 1: AVX2 + FMA, 2: the baseline 16-byte vectors.
inline int isa_index() {
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return 0;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return 1;
#endif
  return 2;
}

}  // namespace detail

/// \brief The ISA measured_fp32_peak_gflops uses on this CPU.
inline PeakIsa peak_isa() {
  switch (detail::isa_index()) {
    case 0:
      return {"AVX-512F", 16};
#if defined(__x86_64__)
    case 1:
      return {"AVX2+FMA", 8};
    default:
      return {"SSE2", 4};
#else
    default:
      return {"128-bit", 4};
#endif
  }
}

/// \brief fp32 FMA GFLOP/s of all host threads together over `iters` iterations, on the widest
/// vector ISA of the CPU (peak_isa()).
inline double measured_fp32_peak_gflops(long iters = 5'000'000) {
  const int isa     = detail::isa_index();
  const int lanes   = peak_isa().lanes;
  const int threads = Kokkos::DefaultHostExecutionSpace().concurrency();
  Kokkos::View<float*, Kokkos::HostSpace> sink("pmt::obs::peak::sink", threads);
  Kokkos::Timer timer;
  Kokkos::parallel_for("pmt::obs::peak", Kokkos::RangePolicy<Kokkos::DefaultHostExecutionSpace>(0, threads),
                       [=](int t) {
#if defined(__x86_64__) && defined(__GNUC__)
                         sink(t) = isa == 0 ? detail::chains_avx512(iters)
                                            : (isa == 1 ? detail::chains_avx2(iters) : detail::chains_base(iters));
#else
        (void)isa;
        sink(t) = detail::chains_base(iters);
#endif
                       });
  Kokkos::fence();
  return 2.0 * lanes * detail::chains * double(iters) * threads / timer.seconds() / 1e9;
}

/// \brief "AVX-512F, 16 fp32 lanes": what a peak line should say it measured.
inline std::string peak_isa_description() {
  const PeakIsa p = peak_isa();
  return std::string(p.name) + ", " + std::to_string(p.lanes) + " fp32 lanes";
}

/// \brief This rank's peak in GFLOP/s on Exec: on a host space the measured fp32 FMA peak (every
/// rank of a node measuring at once gets its share), on a GPU the device's (bf16 tensor cores
/// when `bf16` and the device has them, else fp32 lanes; pmt::detail::cuda_device_peak_gflops).
template <class Exec>
double peak_gflops(bool bf16) {
  if constexpr (is_host_space_v<Exec>) {
    (void)bf16;
    return measured_fp32_peak_gflops();
  } else {
#if PMT_ENABLE_CUDA
    const double tensor = bf16 ? pmt::detail::cuda_device_peak_gflops(true) : 0.0;
    return tensor > 0 ? tensor : pmt::detail::cuda_device_peak_gflops(false);
#else
    (void)bf16;
    return 0.0;
#endif
  }
}

/// \brief What peak_gflops<Exec>(bf16) counts: "measured fp32", "GPU bf16 tensor-core" or "GPU fp32".
template <class Exec>
const char* peak_kind(bool bf16) {
  if constexpr (is_host_space_v<Exec>) {
    (void)bf16;
    return "measured fp32";
  } else {
#if PMT_ENABLE_CUDA
    if (bf16 && pmt::detail::cuda_device_peak_gflops(true) > 0) return "GPU bf16 tensor-core";
#endif
    (void)bf16;
    return "GPU fp32";
  }
}

/// \brief Where peak_gflops<Exec> comes from, for a banner.
template <class Exec>
std::string peak_source() {
  if constexpr (is_host_space_v<Exec>)
    return peak_isa_description();
  else
    return "multiprocessors x boost clock x the per-clock rate of the device's compute capability";
}

}  // namespace pmt::obs
