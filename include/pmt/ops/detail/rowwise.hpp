// SPDX-License-Identifier: Apache-2.0
#pragma once
// Building blocks of the row-wise kernels (softmax, layernorm, cross-entropy, GELU):
// - lane reductions: a row is summed in `row_lanes` interleaved partial sums that are combined
//   pairwise in a fixed order. The order depends only on the row length (deterministic) and the
//   compiler can map the lanes onto SIMD registers without reassociating anything.
// - exp_fast / tanh_fast: for float, a branch-free exp (Cody-Waite range reduction, degree-6
//   polynomial, 2^k by exponent bits; <= 2 ulp on [-87, 88]) that vectorizes; for double the
//   library functions. GCC vectorizes these loops only with -fno-trapping-math (pmt's own
//   targets use it; see docs/ops.md, "Build flags"); without it they are correct but scalar.

#include "pmt/core/tensor.hpp"
#include "pmt/detail/kokkos_compat.hpp"
#include "pmt/ops/detail/host_backend.hpp"
#include "pmt/ops/detail/lanes.hpp"

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>
#include <type_traits>

// The float rows of sums, maxima and exponentials take the host SIMD back end where
// host_simd_t<float> has one (host_backend.hpp: AVX2 + FMA when the compiler targets it); the
// portable loops below run everywhere else (other CPUs, GPUs). Both sum in the same 16-lane order.

namespace pmt::detail {

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

/// sum_j S(x[j]) over a row: lane_sum's lanes, order and result. On a host SIMD back end the
/// float lanes sit in registers (GCC vectorises lane_sum's loop only half-way: one ymm, two xmm
/// and a scalar lane).
template <class S, class T>
KOKKOS_INLINE_FUNCTION S row_sum(const T* x, std::int64_t n) {
  if constexpr (std::is_same_v<S, float> && host_simd_t<T>::simd) {
    S acc[row_lanes];
    const std::int64_t j = host_simd_t<T>::lanes_sum(x, n, acc);
    for (int l = 0; l < row_lanes; ++l)
      if (j + l < n) acc[l] += x[j + l];
    return combine_lanes<S, T>(acc);
  } else {
    return lane_sum<S>(x, n, [](T e) { return static_cast<S>(e); });
  }
}

/// max_j x[j] (-inf for an empty row). Lane l keeps max(x[l], x[l + 16], ...) with
/// `x > acc ? x : acc` (a NaN in x is skipped, as the scalar form does); a host SIMD back end
/// keeps the same lanes in registers (floats and doubles).
template <class T>
KOKKOS_INLINE_FUNCTION T lane_max(const T* x, std::int64_t n) {
  T acc[row_lanes];
  std::int64_t j = 0;
  using K        = host_simd_t<std::conditional_t<std::is_same_v<T, double>, float, T>>;  // doubles too
  if constexpr (K::simd) {
    j = K::lanes_max(x, n, acc);
  } else {
    for (int l = 0; l < row_lanes; ++l) acc[l] = -infinity<T>();
    for (; j + row_lanes <= n; j += row_lanes)
      for (int l = 0; l < row_lanes; ++l) acc[l] = x[j + l] > acc[l] ? x[j + l] : acc[l];
  }
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
    // floor, one vector convert; no sign-dependent select. A NaN passes the clamps above; the
    // bound on t (127 > 88 / ln 2) maps it into range for the conversion, which would be
    // undefined behaviour for NaN, and r carries the NaN into the result.
    float t        = xc * 1.44269504088896341f;
    t              = t < 127.0f ? t : 127.0f;
    const float kf = static_cast<float>(static_cast<std::int32_t>(t + 128.5f)) - 128.0f;
    const float r  = (xc - kf * 0.693359375f) + kf * 2.12194440e-4f;  // x - k ln 2, two parts
    float p        = 1.9875691500e-4f;
    p              = p * r + 1.3981999507e-3f;
    p              = p * r + 8.3334519073e-3f;
    p              = p * r + 4.1665795894e-2f;
    p              = p * r + 1.6666665459e-1f;
    p              = p * r + 5.0000001201e-1f;
    p              = p * r * r + r + 1.0f;
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
    // Bounded above so that a NaN (or an x > 0 outside the contract, up to +inf) converts to an
    // integer in range instead of undefined behaviour; r keeps the NaN. No change for x <= 0.
    float t        = xc * 1.44269504088896341f;
    t              = t < 0.5f ? t : 0.5f;
    const float kf = static_cast<float>(static_cast<std::int32_t>(t + 128.5f)) - 128.0f;
    const float r  = (xc - kf * 0.693359375f) + kf * 2.12194440e-4f;
    float p        = 1.3981999507e-3f;
    p              = p * r + 8.3334519073e-3f;
    p              = p * r + 4.1665795894e-2f;
    p              = p * r + 1.6666665459e-1f;
    p              = p * r + 5.0000001201e-1f;
    p              = p * r * r + r + 1.0f;
    return p * pow2_float(kf) * static_cast<float>(x >= -87.0f);
  } else {
    return math::exp(x);
  }
}

/// sum_j exp(x[j] - mx) over a row (every x[j] <= mx) in the 16-lane order of lane_sum; with
/// `y` non-null also y[j] = exp(x[j] - mx). One pass over x: the exponentials are computed once.
/// While it works on this row it prefetches the next one (`next_x`, and `next_y` for writing;
/// either may be null), so that the row's arithmetic overlaps the memory traffic of the next.
template <class T>
KOKKOS_INLINE_FUNCTION T exp_sum_row(const T* x, std::int64_t n, T mx, T* y, const T* next_x, T* next_y) {
  T acc[row_lanes];
  std::int64_t j = 0;
  if constexpr (host_simd_t<T>::simd) {
    j = host_simd_t<T>::lanes_exp_sum(x, n, mx, y, next_x, next_y, acc);
  } else {
    for (int l = 0; l < row_lanes; ++l) acc[l] = T(0);
    for (; j + row_lanes <= n; j += row_lanes) {
      prefetch_lanes(next_x, j);
      prefetch_lanes<true>(next_y, j);
      for (int l = 0; l < row_lanes; ++l) {
        const T e = exp_nonpositive(x[j + l] - mx);
        if (y) y[j + l] = e;
        acc[l] += e;
      }
    }
  }
  for (int l = 0; l < row_lanes; ++l)  // tail: fewer than row_lanes elements
    if (j + l < n) {
      const T e = exp_nonpositive(x[j + l] - mx);
      if (y) y[j + l] = e;
      acc[l] += e;
    }
  return combine_lanes<T, T>(acc);
}

/// sum_j exp(x[j] - mx) over a row (every x[j] <= mx): exp_sum_row without output or prefetch
/// (the cross-entropies' normalisers).
template <class T>
KOKKOS_INLINE_FUNCTION T row_exp_sum(const T* x, std::int64_t n, T mx) {
  return exp_sum_row(x, n, mx, static_cast<T*>(nullptr), static_cast<const T*>(nullptr), static_cast<T*>(nullptr));
}

// --- device-shaped rows: a team per group of rows, vector lanes along each row -----------------
// On device spaces one thread per row would leave a row's elements to one GPU thread; there each
// row goes to one team thread and its vector lanes (ThreadVectorRange), and the row's max and
// sums are vector reductions. Their order is the vector unit's, not the 16-lane order of the host
// path: deterministic for a given space, equal to the host results to rounding.

/// Whether row-wise ops on Exec take the team path (device spaces).
template <class Exec>
inline constexpr bool rowwise_teams_v = !is_host_space_v<Exec>;

/// Test hook: while true, host spaces take the team path too (one thread and one lane per team),
/// so that the suite checks it without a device.
inline bool& rowwise_force_teams() {
  static bool force = false;
  return force;
}

template <class Exec>
bool rowwise_use_teams() {
  return rowwise_teams_v<Exec> || rowwise_force_teams();
}

/// f(member, r) for every row r < nrows: 4 rows per team of 4 threads x 32 lanes on a device, one
/// row per team on the host; f spreads its row over the member's vector lanes.
template <class Exec, class F>
void for_each_row_team(const Exec& exec, const char* label, std::int64_t nrows, const F& f) {
  if (nrows <= 0) return;
  constexpr int rows_per_team = is_host_space_v<Exec> ? 1 : 4, lanes = is_host_space_v<Exec> ? 1 : 32;
  using Policy = Kokkos::TeamPolicy<Exec>;
  const Policy policy(exec, static_cast<int>((nrows + rows_per_team - 1) / rows_per_team), rows_per_team, lanes);
  Kokkos::parallel_for(
      label, policy, KOKKOS_LAMBDA(const typename Policy::member_type& m) {
        Kokkos::parallel_for(Kokkos::TeamThreadRange(m, rows_per_team), [&](int i) {
          const std::int64_t r = static_cast<std::int64_t>(m.league_rank()) * rows_per_team + i;
          if (r < nrows) f(m, r);
        });
      });
}

/// max_j x[j] over the member's vector lanes (the lowest finite value when n == 0).
template <class Member, class T>
KOKKOS_INLINE_FUNCTION T vector_max(const Member& m, const T* x, std::int64_t n) {
  T mx{};
  Kokkos::parallel_reduce(
      Kokkos::ThreadVectorRange(m, n), [&](std::int64_t j, T& a) { a = x[j] > a ? x[j] : a; }, Kokkos::Max<T>(mx));
  return mx;
}

/// sum_j g(j) over the member's vector lanes.
template <class S, class Member, class G>
KOKKOS_INLINE_FUNCTION S vector_sum(const Member& m, std::int64_t n, const G& g) {
  S s = S(0);
  Kokkos::parallel_reduce(
      Kokkos::ThreadVectorRange(m, n), [&](std::int64_t j, S& a) { a += g(j); }, s);
  return s;
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
