// SPDX-License-Identifier: Apache-2.0
#pragma once
// Building blocks of the row-wise kernels (softmax, layernorm, cross-entropy, GELU):
// - lane reductions: a row is summed in `row_lanes` interleaved partial sums that are combined
//   pairwise in a fixed order. The order depends only on the row length (deterministic) and the
//   compiler can map the lanes onto SIMD registers without reassociating anything.
// - exp_fast / tanh_fast: for float, a branch-free exp (Cody-Waite range reduction, degree-6
//   polynomial, 2^k by exponent bits; <= 2 ulp on [-87, 88]) that vectorizes; for double the
//   library functions. GCC vectorizes these loops only with -fno-trapping-math (pmt's own
//   targets use it; see docs/performance.md); without it they are correct but scalar.

#include "pmt/core/tensor.hpp"
#include "pmt/detail/kokkos_compat.hpp"

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <type_traits>

namespace pmt::detail {

inline constexpr int row_lanes = 16;

template <class S, class T>
KOKKOS_INLINE_FUNCTION S combine_lanes(S (&acc)[row_lanes]) {
  for (int w = row_lanes / 2; w > 0; w /= 2)
    for (int l = 0; l < w; ++l) acc[l] += acc[l + w];
  return acc[0];
}

/// sum_j f(x[j]) over a row, in the fixed lane order.
template <class S, class T, class F>
KOKKOS_INLINE_FUNCTION S lane_sum(const T* x, std::int64_t n, F f) {
  S acc[row_lanes];
  for (int l = 0; l < row_lanes; ++l) acc[l] = S(0);
  std::int64_t j = 0;
  for (; j + row_lanes <= n; j += row_lanes)
    for (int l = 0; l < row_lanes; ++l) acc[l] += f(x[j + l]);
  for (int l = 0; l < row_lanes; ++l)  // tail: fewer than row_lanes elements
    if (j + l < n) acc[l] += f(x[j + l]);
  return combine_lanes<S, T>(acc);
}

/// max_j x[j] (-inf for an empty row).
template <class T>
KOKKOS_INLINE_FUNCTION T lane_max(const T* x, std::int64_t n) {
  T acc[row_lanes];
  for (int l = 0; l < row_lanes; ++l) acc[l] = -infinity<T>();
  std::int64_t j = 0;
  for (; j + row_lanes <= n; j += row_lanes)
    for (int l = 0; l < row_lanes; ++l) acc[l] = x[j + l] > acc[l] ? x[j + l] : acc[l];
  for (int l = 0; l < row_lanes; ++l)
    if (j + l < n) acc[l] = x[j + l] > acc[l] ? x[j + l] : acc[l];
  for (int w = row_lanes / 2; w > 0; w /= 2)
    for (int l = 0; l < w; ++l) acc[l] = acc[l + w] > acc[l] ? acc[l + w] : acc[l];
  return acc[0];
}

/// 2^k for an integer-valued float k in [-126, 127], built from the exponent bits (vectorises).
KOKKOS_INLINE_FUNCTION float pow2_float(float k) {
  const std::int32_t bits = (static_cast<std::int32_t>(k) + 127) * (1 << 23);
#if defined(__CUDA_ARCH__)
  return __int_as_float(bits);
#else
  return __builtin_bit_cast(float, bits);  // GCC >= 11, Clang >= 9
#endif
}

/// exp(x): vectorizable polynomial for float, the library exp for double.
template <class T>
KOKKOS_INLINE_FUNCTION T exp_fast(T x) {
  if constexpr (std::is_same_v<T, float>) {
    float xc = x > 88.0f ? 88.0f : x;
    xc       = xc < -87.0f ? -87.0f : xc;
    // k = round(x / ln 2): truncation of a positive number (t + 128.5 lies in [3, 256]) is a
    // floor, one vector convert; no sign-dependent select.
    const float t  = xc * 1.44269504088896341f;
    const float kf = static_cast<float>(static_cast<std::int32_t>(t + 128.5f)) - 128.0f;
    const float r  = (xc - kf * 0.693359375f) + kf * 2.12194440e-4f;  // x - k ln 2, two parts
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    return p * pow2_float(kf) * static_cast<float>(x >= -87.0f);  // 0 below the range; a mask, not a branch
  } else {
    return math::exp(x);
  }
}

/// exp(x) for x <= 0 (softmax and cross-entropy arguments x - max): no upper clamp and a degree-5
/// polynomial, 2.3e-7 relative error on [-87, 0], about 30 % cheaper than exp_fast. Double: exp.
template <class T>
KOKKOS_INLINE_FUNCTION T exp_nonpositive(T x) {
  if constexpr (std::is_same_v<T, float>) {
    const float xc = x < -87.0f ? -87.0f : x;
    const float t  = xc * 1.44269504088896341f;
    const float kf = static_cast<float>(static_cast<std::int32_t>(t + 128.5f)) - 128.0f;
    const float r  = (xc - kf * 0.693359375f) + kf * 2.12194440e-4f;
    float p = 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    return p * pow2_float(kf) * static_cast<float>(x >= -87.0f);
  } else {
    return math::exp(x);
  }
}

/// tanh(u) = 1 - 2 / (exp(2u) + 1) with exp_fast for float; the library tanh for double.
template <class T>
KOKKOS_INLINE_FUNCTION T tanh_fast(T u) {
  if constexpr (std::is_same_v<T, float>) {
    return 1.0f - 2.0f / (exp_fast(2.0f * u) + 1.0f);
  } else {
    return math::tanh(u);
  }
}

}  // namespace pmt::detail
