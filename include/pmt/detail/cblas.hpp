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

}  // namespace pmt::detail
#endif
