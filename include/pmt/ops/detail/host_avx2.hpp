// SPDX-License-Identifier: Apache-2.0
#pragma once
// The AVX2 + FMA host back end of the float row-wise and elementwise kernels: the only place of
// pmt's op code that holds x86 intrinsics. It exists where the compiler targets such a CPU on the
// host pass (-march=native, or -mavx2 -mfma) and is selected by host_backend.hpp's trait; the op
// headers call it through that trait and keep their portable loops for every other case. Every
// kernel here sums in the 16-lane order of lanes.hpp, so it gives the portable loops' bits.

#include "pmt/ops/detail/lanes.hpp"

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

#if defined(__AVX2__) && defined(__FMA__) && !defined(__CUDA_ARCH__) && !defined(__HIP_DEVICE_COMPILE__)
#define PMT_HOST_AVX2 1
#include <immintrin.h>
#else
#define PMT_HOST_AVX2 0
#endif

#if PMT_HOST_AVX2
namespace pmt::detail::host {

/// The AVX2 + FMA kernels. A `lanes_*` kernel handles a row's full blocks of 16 elements: it
/// leaves the 16 lane results in acc and returns how many elements it consumed; the caller adds
/// the tail and combines the lanes (lanes.hpp).
struct Avx2 {
  static constexpr bool simd        = true;
  static constexpr const char* name = "avx2+fma";
  static constexpr int width        = 8;  ///< floats per register: gelu() and gelu_backward() do this many

  /// acc[l] = sum of x[j + l] over the full blocks.
  static std::int64_t lanes_sum(const float* x, std::int64_t n, float* acc) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    std::int64_t j = 0;
    for (; j + 16 <= n; j += 16) {
      a0 = _mm256_add_ps(a0, _mm256_loadu_ps(x + j));
      a1 = _mm256_add_ps(a1, _mm256_loadu_ps(x + j + 8));
    }
    _mm256_storeu_ps(acc, a0);
    _mm256_storeu_ps(acc + 8, a1);
    return j;
  }

  /// acc[l] = max of x[j + l] over the full blocks (-inf without one); maxps(a, b) = a > b ? a : b
  /// per lane, the scalar expression of the portable loop, NaN handling included. (GCC keeps that
  /// loop scalar: 16 vmaxss per 16 elements, 30 % of softmax's time.)
  static std::int64_t lanes_max(const float* x, std::int64_t n, float* acc) {
    __m256 a0 = _mm256_set1_ps(-std::numeric_limits<float>::infinity()), a1 = a0;
    std::int64_t j = 0;
    for (; j + 16 <= n; j += 16) {
      a0 = _mm256_max_ps(_mm256_loadu_ps(x + j), a0);
      a1 = _mm256_max_ps(_mm256_loadu_ps(x + j + 8), a1);
    }
    _mm256_storeu_ps(acc, a0);
    _mm256_storeu_ps(acc + 8, a1);
    return j;
  }

  /// lanes_max for doubles: four registers of four lanes.
  static std::int64_t lanes_max(const double* x, std::int64_t n, double* acc) {
    __m256d a[4];
    for (auto& v : a) v = _mm256_set1_pd(-std::numeric_limits<double>::infinity());
    std::int64_t j = 0;
    for (; j + 16 <= n; j += 16)
      for (int q = 0; q < 4; ++q) a[q] = _mm256_max_pd(_mm256_loadu_pd(x + j + 4 * q), a[q]);
    for (int q = 0; q < 4; ++q) _mm256_storeu_pd(acc + 4 * q, a[q]);
    return j;
  }

  /// 2^k p(x - k ln 2) for eight floats, given k (as a float and as an integer): the reduction in
  /// two parts, the degree-5 polynomial, and 2^k added to the exponent bits. For |x - k ln 2| <=
  /// ln 2 / 2, p lies in [0.7, 1.42]; with k in [-126, 127] the result is a normal float.
  static __m256 exp8_reduced(__m256 xc, __m256 kf, __m256i k) {
    __m256 r = _mm256_fnmadd_ps(kf, _mm256_set1_ps(0.693359375f), xc);
    r        = _mm256_fmadd_ps(kf, _mm256_set1_ps(2.12194440e-4f), r);
    __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(1.3981999507e-3f), r, _mm256_set1_ps(8.3334519073e-3f));
    p        = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p        = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p        = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p        = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
    return _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), _mm256_slli_epi32(k, 23)));
  }

  /// exp(x) for eight floats x <= 0, the algorithm of exp_nonpositive<float> (rowwise.hpp) written
  /// out (about 18 instructions per eight): k = ceil(x log2 e - 1/2) by one truncating convert
  /// (k >= -126 for x >= -87). 0 below -87 (where exp underflows), NaN stays NaN.
  static __m256 exp_nonpositive8(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.0f);
    const __m256 xc = _mm256_max_ps(lo, x);  // NaN in x passes through (maxps returns its 2nd operand)
    const __m256i k =
        _mm256_cvttps_epi32(_mm256_fmadd_ps(xc, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(-0.5f)));
    return _mm256_andnot_ps(_mm256_cmp_ps(x, lo, _CMP_LT_OQ), exp8_reduced(xc, _mm256_cvtepi32_ps(k), k));
  }

  /// exp(x) for eight floats in [-87, 88] (callers clamp): k = floor(x log2 e + 1/2), in [-126, 127].
  static __m256 exp8_clamped(__m256 xc) {
    const __m256 kf = _mm256_round_ps(_mm256_fmadd_ps(xc, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)),
                                      _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    return exp8_reduced(xc, kf, _mm256_cvttps_epi32(kf));
  }

  /// acc[l] = sum of exp(x[j + l] - mx) over the full blocks (every x <= mx), y[j] = the
  /// exponentials when y is non-null; prefetches the next row (either pointer may be null).
  static std::int64_t lanes_exp_sum(const float* x, std::int64_t n, float mx, float* y, const float* next_x,
                                    float* next_y, float* acc) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    const __m256 m = _mm256_set1_ps(mx);
    std::int64_t j = 0;
    for (; j + 16 <= n; j += 16) {
      prefetch_lanes(next_x, j);
      prefetch_lanes<true>(next_y, j);
      const __m256 e0 = exp_nonpositive8(_mm256_sub_ps(_mm256_loadu_ps(x + j), m));
      const __m256 e1 = exp_nonpositive8(_mm256_sub_ps(_mm256_loadu_ps(x + j + 8), m));
      if (y) {
        _mm256_storeu_ps(y + j, e0);
        _mm256_storeu_ps(y + j + 8, e1);
      }
      a0 = _mm256_add_ps(a0, e0);
      a1 = _mm256_add_ps(a1, e1);
    }
    _mm256_storeu_ps(acc, a0);
    _mm256_storeu_ps(acc + 8, a1);
    return j;
  }

  /// The tanh GELU's constants as the portable loops round them to float: -2 sqrt(2 / pi),
  /// 0.044715, 2 sqrt(2 / pi) and 3 * 0.044715 (elementwise.hpp fills them).
  struct GeluConstants {
    float minus_2k, a, two_k, three_a;
  };

  /// s = 1 / (1 + exp(-2u)), u = sqrt(2 / pi) (x + a x^3), for eight floats.
  static __m256 gelu_s8(__m256 x, const GeluConstants& c) {
    const __m256 z  = _mm256_mul_ps(_mm256_set1_ps(c.minus_2k),
                                    _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(c.a), x), _mm256_mul_ps(x, x), x));
    const __m256 zc = _mm256_min_ps(_mm256_max_ps(z, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
    return _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_add_ps(_mm256_set1_ps(1.0f), exp8_clamped(zc)));
  }

  /// y[i .. i + 8) = x s(x): the tanh GELU of eight floats.
  static void gelu(const float* x, float* y, std::size_t i, const GeluConstants& c) {
    const __m256 xv = _mm256_loadu_ps(x + i);
    _mm256_storeu_ps(y + i, _mm256_mul_ps(xv, gelu_s8(xv, c)));
  }

  /// dx[i .. i + 8) = dy (s + x s (1 - s) 2k (1 + 3a x^2)): the GELU backward of eight floats.
  static void gelu_backward(const float* x, const float* dy, float* dx, std::size_t i, const GeluConstants& c) {
    const __m256 xv = _mm256_loadu_ps(x + i), s = gelu_s8(xv, c);
    const __m256 du2 =
        _mm256_mul_ps(_mm256_set1_ps(c.two_k),
                      _mm256_fmadd_ps(_mm256_set1_ps(c.three_a), _mm256_mul_ps(xv, xv), _mm256_set1_ps(1.0f)));
    const __m256 g =
        _mm256_fmadd_ps(_mm256_mul_ps(_mm256_mul_ps(xv, s), _mm256_sub_ps(_mm256_set1_ps(1.0f), s)), du2, s);
    _mm256_storeu_ps(dx + i, _mm256_mul_ps(_mm256_loadu_ps(dy + i), g));
  }

  /// y = ((x - m) rs) w + b over [j, C) of one row, eight at a time, then one by one.
  static void layernorm_normalise_row(const float* xr, float* yr, const float* wp, const float* bp, std::int64_t j,
                                      std::int64_t C, float m, float rs) {
    const __m256 vm = _mm256_set1_ps(m), vr = _mm256_set1_ps(rs);
    for (; j + 8 <= C; j += 8) {
      const __m256 h = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(xr + j), vm), vr);
      _mm256_storeu_ps(yr + j, _mm256_fmadd_ps(h, _mm256_loadu_ps(wp + j), _mm256_loadu_ps(bp + j)));
    }
    for (; j < C; ++j) yr[j] = ((xr[j] - m) * rs) * wp[j] + bp[j];
  }

  /// layernorm_forward for float x, y and statistics on a host space: the 16 lanes in two
  /// registers for the mean and the two-pass variance, and rows pipelined in chunks: the mean pass
  /// of row n, which reads x from memory, also normalises and stores row n - 1, whose x is still
  /// in L1. The read and the write stream then run in one loop, which the hardware prefetchers
  /// keep busy better than the portable kernel's software prefetch (on 64 MiB about 8 % faster,
  /// the same bits).
  template <class Exec, class XV, class WV, class YV, class SV>
  static void layernorm_forward_rows(const Exec& exec, const char* op, const XV& x, const WV& weight, const WV& bias,
                                     const YV& y, const SV& mean, const SV& rstd, float eps) {
    const auto N = static_cast<std::int64_t>(x.extent(0));
    const auto C = static_cast<std::int64_t>(x.extent(1));
    // Chunks of up to 64 rows, at least eight per thread where there are rows enough for it.
    const std::int64_t per_thread =
        N / (8 * static_cast<std::int64_t>(exec.concurrency() > 0 ? exec.concurrency() : 1));
    const std::int64_t chunk  = per_thread < 1 ? 1 : (per_thread > 64 ? 64 : per_thread);
    const std::int64_t chunks = (N + chunk - 1) / chunk;
    const float* wp           = weight.data();
    const float* bp           = bias.data();
    Kokkos::parallel_for(op, Kokkos::RangePolicy<Exec>(exec, 0, chunks), [=](std::int64_t k) {
      const std::int64_t r0 = k * chunk, r1 = r0 + chunk < N ? r0 + chunk : N;
      float pm = 0, prs = 0;  // row n - 1's statistics
      for (std::int64_t n = r0; n < r1; ++n) {
        const float* xr = &x(n, 0);
        float acc[row_lanes];
        std::int64_t j = 0;
        if (n > r0) {  // lanes_sum, with row n - 1 normalised alongside
          const float* xp = &x(n - 1, 0);
          float* yp       = &y(n - 1, 0);
          const __m256 vm = _mm256_set1_ps(pm), vr = _mm256_set1_ps(prs);
          __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
          for (; j + 16 <= C; j += 16) {
            a0              = _mm256_add_ps(a0, _mm256_loadu_ps(xr + j));
            a1              = _mm256_add_ps(a1, _mm256_loadu_ps(xr + j + 8));
            const __m256 h0 = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(xp + j), vm), vr);
            const __m256 h1 = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(xp + j + 8), vm), vr);
            _mm256_storeu_ps(yp + j, _mm256_fmadd_ps(h0, _mm256_loadu_ps(wp + j), _mm256_loadu_ps(bp + j)));
            _mm256_storeu_ps(yp + j + 8, _mm256_fmadd_ps(h1, _mm256_loadu_ps(wp + j + 8), _mm256_loadu_ps(bp + j + 8)));
          }
          layernorm_normalise_row(xp, yp, wp, bp, j, C, pm, prs);
          _mm256_storeu_ps(acc, a0);
          _mm256_storeu_ps(acc + 8, a1);
        } else {
          j = lanes_sum(xr, C, acc);
        }
        for (int l = 0; l < row_lanes; ++l)
          if (j + l < C) acc[l] += xr[j + l];
        const float m = combine_lanes<float, float>(acc) / static_cast<float>(C);
        // Two-pass variance (no cancellation) over the row, now in L1.
        const __m256 vm = _mm256_set1_ps(m);
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        j = 0;
        for (; j + 16 <= C; j += 16) {
          const __m256 d0 = _mm256_sub_ps(_mm256_loadu_ps(xr + j), vm);
          const __m256 d1 = _mm256_sub_ps(_mm256_loadu_ps(xr + j + 8), vm);
          a0              = _mm256_fmadd_ps(d0, d0, a0);
          a1              = _mm256_fmadd_ps(d1, d1, a1);
        }
        _mm256_storeu_ps(acc, a0);
        _mm256_storeu_ps(acc + 8, a1);
        for (int l = 0; l < row_lanes; ++l)
          if (j + l < C) {
            const float d = xr[j + l] - m;
            acc[l] += d * d;
          }
        const float v = combine_lanes<float, float>(acc) / static_cast<float>(C);
        pm = mean(n) = m;
        prs = rstd(n) = 1.0f / std::sqrt(v + eps);
      }
      if (r1 > r0) layernorm_normalise_row(&x(r1 - 1, 0), &y(r1 - 1, 0), wp, bp, 0, C, pm, prs);
    });
  }
};

}  // namespace pmt::detail::host
#endif
