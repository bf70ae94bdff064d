// SPDX-License-Identifier: Apache-2.0
#pragma once
// Which host back end the float row-wise and elementwise kernels take. The op headers hold no
// intrinsics: they ask `host_kernels_t<Exec, T>` (or `host_simd_t<T>` where no space is in
// sight) and take its SIMD kernels when `simd` is true, their portable loops otherwise.
//   Portable  no SIMD kernels: device spaces, types other than float, CPUs the build does not
//             target with AVX2 + FMA, and the device pass of a CUDA build
//   Avx2      host_avx2.hpp, where PMT_HOST_AVX2 is 1
//   Avx512    host_avx512.hpp, where PMT_HOST_AVX512 is 1 as well (Avx2 with sixteen floats a
//             register for the exponential-bound kernels and the row reductions)
// A new back end (NEON, SVE) is one more struct with the same members and one more line here.

#include "pmt/core/tensor.hpp"
#include "pmt/ops/detail/host_avx2.hpp"
#include "pmt/ops/detail/host_avx512.hpp"

#include <type_traits>

namespace pmt::detail::host {

/// No SIMD kernels: the op headers' portable loops run.
struct Portable {
  static constexpr bool simd        = false;
  static constexpr const char* name = "portable";
};

/// The host back end this translation unit's compiler targets.
#if PMT_HOST_AVX512
using Native = Avx512;
#elif PMT_HOST_AVX2
using Native = Avx2;
#else
using Native = Portable;
#endif

}  // namespace pmt::detail::host

namespace pmt::detail {

/// The back end of float kernels on raw host pointers (Native for float, Portable otherwise).
template <class T>
using host_simd_t = std::conditional_t<std::is_same_v<T, float>, host::Native, host::Portable>;

/// The back end of an op on Exec over T: host_simd_t<T> on host spaces, Portable on devices.
template <class Exec, class T>
using host_kernels_t = std::conditional_t<pmt::is_host_space_v<Exec>, host_simd_t<T>, host::Portable>;

}  // namespace pmt::detail
