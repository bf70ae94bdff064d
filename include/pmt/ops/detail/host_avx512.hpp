// SPDX-License-Identifier: Apache-2.0
#pragma once
// The AVX-512 host back end: the AVX2 back end (host_avx2.hpp) with its exponential-bound kernels
// (GELU forward and backward, the exp rows of softmax and the cross-entropies) and the row sums
// and maxima sixteen floats a register. It exists where the compiler also targets AVX-512F on
// the host pass (-march=native on such a CPU); host_backend.hpp then selects it. Every element
// goes through the same IEEE operations in the same order as in the AVX2 kernels, and the 16
// lanes of a row's reductions sit in one register instead of two: the same bits.

#include "pmt/ops/detail/host_avx2.hpp"
#include "pmt/ops/detail/lanes.hpp"

#include <cstddef>
#include <cstdint>
#include <limits>

#if PMT_HOST_AVX2 && defined(__AVX512F__)
#define PMT_HOST_AVX512 1
#else
#define PMT_HOST_AVX512 0
#endif

#if PMT_HOST_AVX512
namespace pmt::detail::host {

/// The AVX-512F kernels; what it does not redefine (layernorm rows, double maxima) is Avx2's.
struct Avx512 : Avx2 {
  static constexpr const char* name = "avx512f";
  static constexpr int width        = 16;  ///< floats per register: gelu() and gelu_backward() do this many
  using Avx2::lanes_max;                   // the double maxima

  // The all-lanes forms of six instructions, written as zero-masked ones with every lane set:
  // the same instruction and results, without the undefined pass-through operand that GCC 12
  // reports as "may be used uninitialized" in its own avx512fintrin.h (fixed in GCC 13).
  static constexpr __mmask16 all = 0xFFFF;
  static __m512 max(__m512 a, __m512 b) { return _mm512_maskz_max_ps(all, a, b); }
  static __m512 min(__m512 a, __m512 b) { return _mm512_maskz_min_ps(all, a, b); }
  static __m512i truncate(__m512 a) { return _mm512_maskz_cvttps_epi32(all, a); }
  static __m512 floor(__m512 a) {
    return _mm512_maskz_roundscale_ps(all, a, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  }
  static __m512i exponent(__m512i k) { return _mm512_maskz_slli_epi32(all, k, 23); }
  static __m512 to_float(__m512i k) { return _mm512_maskz_cvtepi32_ps(all, k); }

  /// acc[l] = sum of x[j + l] over the full blocks (Avx2::lanes_sum in one register).
  static std::int64_t lanes_sum(const float* x, std::int64_t n, float* acc) {
    __m512 a       = _mm512_setzero_ps();
    std::int64_t j = 0;
    for (; j + 16 <= n; j += 16) a = _mm512_add_ps(a, _mm512_loadu_ps(x + j));
    _mm512_storeu_ps(acc, a);
    return j;
  }

  /// acc[l] = max of x[j + l] over the full blocks (-inf without one), as Avx2::lanes_max.
  static std::int64_t lanes_max(const float* x, std::int64_t n, float* acc) {
    __m512 a       = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    std::int64_t j = 0;
    for (; j + 16 <= n; j += 16) a = max(_mm512_loadu_ps(x + j), a);
    _mm512_storeu_ps(acc, a);
    return j;
  }

  /// Avx2::exp8_reduced for sixteen floats.
  static __m512 exp16_reduced(__m512 xc, __m512 kf, __m512i k) {
    __m512 r = _mm512_fnmadd_ps(kf, _mm512_set1_ps(0.693359375f), xc);
    r        = _mm512_fmadd_ps(kf, _mm512_set1_ps(2.12194440e-4f), r);
    __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(1.3981999507e-3f), r, _mm512_set1_ps(8.3334519073e-3f));
    p        = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p        = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p        = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p        = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
    return _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(p), exponent(k)));
  }

  /// Avx2::exp_nonpositive8 for sixteen floats: 0 below -87, NaN stays NaN.
  static __m512 exp_nonpositive16(__m512 x) {
    const __m512 lo       = _mm512_set1_ps(-87.0f);
    const __m512 xc       = max(lo, x);  // NaN in x passes through (maxps returns its 2nd operand)
    const __m512i k       = truncate(_mm512_fmadd_ps(xc, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(-0.5f)));
    const __mmask16 below = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
    return _mm512_mask_mov_ps(exp16_reduced(xc, to_float(k), k), below, _mm512_setzero_ps());
  }

  /// Avx2::exp8_clamped for sixteen floats in [-87, 88].
  static __m512 exp16_clamped(__m512 xc) {
    const __m512 kf = floor(_mm512_fmadd_ps(xc, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f)));
    return exp16_reduced(xc, kf, truncate(kf));
  }

  /// Avx2::lanes_exp_sum with the 16 lanes in one register.
  static std::int64_t lanes_exp_sum(const float* x, std::int64_t n, float mx, float* y, const float* next_x,
                                    float* next_y, float* acc) {
    __m512 a       = _mm512_setzero_ps();
    const __m512 m = _mm512_set1_ps(mx);
    std::int64_t j = 0;
    for (; j + 16 <= n; j += 16) {
      prefetch_lanes(next_x, j);
      prefetch_lanes<true>(next_y, j);
      const __m512 e = exp_nonpositive16(_mm512_sub_ps(_mm512_loadu_ps(x + j), m));
      if (y) _mm512_storeu_ps(y + j, e);
      a = _mm512_add_ps(a, e);
    }
    _mm512_storeu_ps(acc, a);
    return j;
  }

  /// Avx2::gelu_s8 for sixteen floats.
  static __m512 gelu_s16(__m512 x, const GeluConstants& c) {
    const __m512 z  = _mm512_mul_ps(_mm512_set1_ps(c.minus_2k),
                                    _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(c.a), x), _mm512_mul_ps(x, x), x));
    const __m512 zc = min(max(z, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
    return _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_add_ps(_mm512_set1_ps(1.0f), exp16_clamped(zc)));
  }

  /// y[i .. i + 16) = x s(x): the tanh GELU of sixteen floats.
  static void gelu(const float* x, float* y, std::size_t i, const GeluConstants& c) {
    const __m512 xv = _mm512_loadu_ps(x + i);
    _mm512_storeu_ps(y + i, _mm512_mul_ps(xv, gelu_s16(xv, c)));
  }

  /// dx[i .. i + 16) = dy (s + x s (1 - s) 2k (1 + 3a x^2)): the GELU backward of sixteen floats.
  static void gelu_backward(const float* x, const float* dy, float* dx, std::size_t i, const GeluConstants& c) {
    const __m512 xv = _mm512_loadu_ps(x + i), s = gelu_s16(xv, c);
    const __m512 du2 =
        _mm512_mul_ps(_mm512_set1_ps(c.two_k),
                      _mm512_fmadd_ps(_mm512_set1_ps(c.three_a), _mm512_mul_ps(xv, xv), _mm512_set1_ps(1.0f)));
    const __m512 g =
        _mm512_fmadd_ps(_mm512_mul_ps(_mm512_mul_ps(xv, s), _mm512_sub_ps(_mm512_set1_ps(1.0f), s)), du2, s);
    _mm512_storeu_ps(dx + i, _mm512_mul_ps(_mm512_loadu_ps(dy + i), g));
  }
};

}  // namespace pmt::detail::host
#endif
