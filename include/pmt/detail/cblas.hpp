// SPDX-License-Identifier: Apache-2.0
#pragma once
// The CBLAS header of the BLAS this build links: <cblas.h> (OpenBLAS, BLIS, AOCL, the reference
// CBLAS), or Intel MKL's <mkl_cblas.h> where CMake found only that (PMT_CBLAS_MKL=1, set when
// PMT_CBLAS_LIBRARIES_USER names MKL's libraries; docs/ops.md "Which BLAS"). Nothing when the
// build has no CBLAS.

#include "pmt/config.hpp"

#if PMT_ENABLE_CBLAS
#if PMT_CBLAS_MKL
#include <mkl_cblas.h>
#include <mkl_service.h>
#else
#include <cblas.h>
#endif

#include <dlfcn.h>

#include <cstdint>
#include <limits>

namespace pmt::detail {

/// True when the BLAS computes a small row-major sgemm C = A B (alpha 1, beta 0, no transposes)
/// correctly; checked once per process on an 8 x 8 x 8 product of small integers (exact in fp32)
/// into a C that holds NaN. OpenBLAS 0.3.29 built for several CPUs (DYNAMIC_ARCH) sends such a
/// product to its AVX-512 "direct" kernel whenever the CPU has AVX-512, taken from the table of
/// the kernels it runs; the tables of CPUs without AVX-512 (Haswell, Zen, ...) hold an empty
/// stand-in there, so with OPENBLAS_CORETYPE naming one of them on an AVX-512 CPU the product
/// leaves C as it was. pmt then calls sgemm in its column-major form (C^T = op(B)^T op(A)^T),
/// which OpenBLAS computes through its ordinary kernels.
inline bool cblas_sgemm_row_major_ok() {
  static const bool ok = [] {
    constexpr int n = 8;
    float a[n * n], b[n * n], c[n * n];
    for (int i = 0; i < n * n; ++i) {
      a[i] = float((i * 7) % 5) - 2.0f;
      b[i] = float((i * 3) % 7) - 3.0f;
      c[i] = std::numeric_limits<float>::quiet_NaN();
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) {
        float ref = 0.0f;
        for (int k = 0; k < n; ++k) ref += a[i * n + k] * b[k * n + j];
        if (!(c[i * n + j] == ref)) return false;
      }
    return true;
  }();
  return ok;
}

/// \brief The linked BLAS's bf16 GEMM: C = alpha op(A) op(B) + beta C with bf16 operands (their
/// 16 bits, as pmt::bf16 stores them), fp32 sums and an fp32 C, in the CBLAS argument order.
/// Looked up at run time, since a BLAS has it or not whatever its header says: OpenBLAS'
/// `cblas_sbgemm` (0.3.10 and newer; not in Debian 12's 0.3.21 build), else MKL's
/// `cblas_gemm_bf16bf16f32`. `fn` is null where neither is linked, or where the one found failed
/// a once-per-process check (`failed`): an 8 x 8 x 8 product of small integers (exact in bf16
/// and fp32), for each transpose pair, into a C that holds NaN.
struct CblasBf16Gemm {
  using Fn = void (*)(int order, int ta, int tb, int M, int N, int K, float alpha, const std::uint16_t* A, int lda,
                      const std::uint16_t* B, int ldb, float beta, float* C, int ldc);
  Fn fn    = nullptr;
  const char* name = "none";  ///< the symbol found
  bool failed      = false;   ///< found, but wrong on the check: not used
};

inline const CblasBf16Gemm& cblas_bf16_gemm() {
  static const CblasBf16Gemm g = [] {
    const char* symbol        = nullptr;
    void* f                   = nullptr;
    const char* const names[] = {"cblas_sbgemm", "cblas_gemm_bf16bf16f32"};
    for (const char* s : names)
      if (f == nullptr && (f = dlsym(RTLD_DEFAULT, s)) != nullptr) symbol = s;
    if (f == nullptr) return CblasBf16Gemm{};
    const auto fn   = reinterpret_cast<CblasBf16Gemm::Fn>(f);
    constexpr int n = 8;
    float a[n * n], b[n * n], c[n * n];
    std::uint16_t a16[n * n], b16[n * n];
    for (int i = 0; i < n * n; ++i) {
      a[i]   = float((i * 7) % 5) - 2.0f;
      b[i]   = float((i * 3) % 7) - 3.0f;
      a16[i] = static_cast<std::uint16_t>(__builtin_bit_cast(std::uint32_t, a[i]) >> 16);  // exact: small integers
      b16[i] = static_cast<std::uint16_t>(__builtin_bit_cast(std::uint32_t, b[i]) >> 16);
    }
    for (int t = 0; t < 4; ++t) {
      const bool ta = t & 1, tb = t & 2;
      for (float& x : c) x = std::numeric_limits<float>::quiet_NaN();
      fn(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, n, n, n, 1.0f, a16, n, b16, n,
         0.0f, c, n);
      for (int i = 0; i < n; ++i)
        for (int j = 0; j < n; ++j) {
          float ref = 0.0f;
          for (int k = 0; k < n; ++k) ref += (ta ? a[k * n + i] : a[i * n + k]) * (tb ? b[j * n + k] : b[k * n + j]);
          if (!(c[i * n + j] == ref)) return CblasBf16Gemm{nullptr, symbol, true};
        }
    }
    return CblasBf16Gemm{fn, symbol, false};
  }();
  return g;
}

}  // namespace pmt::detail
#endif
