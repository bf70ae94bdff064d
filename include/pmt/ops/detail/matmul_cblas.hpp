// SPDX-License-Identifier: Apache-2.0
#pragma once
// The vendor matmul on host memory: CBLAS (OpenBLAS) sgemm/dgemm, row-major, and the BLAS's bf16
// GEMM where it has one (detail/cblas.hpp). CBLAS runs on the calling thread and Kokkos' host
// spaces execute synchronously, so no fence is needed.

#include "pmt/config.hpp"
#include "pmt/detail/cblas.hpp"

#if PMT_ENABLE_CBLAS

#include <cstdint>
#include <type_traits>

namespace pmt::detail {

template <class T>
inline constexpr bool cblas_supports_v = std::is_same_v<T, float> || std::is_same_v<T, double>;

/// C[b] = alpha op(A[b]) op(B[b]) + beta C[b]; row-major, leading dims and batch strides given.
template <class T>
void matmul_cblas(std::int64_t batch, bool ta, bool tb, std::int64_t M, std::int64_t N, std::int64_t K, T alpha,
                  const T* A, std::int64_t lda, std::int64_t sa, const T* B, std::int64_t ldb, std::int64_t sb, T beta,
                  T* C, std::int64_t ldc, std::int64_t sc) {
  const CBLAS_TRANSPOSE opa = ta ? CblasTrans : CblasNoTrans;
  const CBLAS_TRANSPOSE opb = tb ? CblasTrans : CblasNoTrans;
  // BLAS rejects a leading dimension of 0 even when the operand is empty (K == 0).
  lda = lda > 0 ? lda : 1;
  ldb = ldb > 0 ? ldb : 1;
  ldc = ldc > 0 ? ldc : 1;
  for (std::int64_t b = 0; b < batch; ++b) {
    if constexpr (std::is_same_v<T, float>) {
      if (!cblas_sgemm_row_major_ok()) {  // the same product, column-major: C^T = op(B)^T op(A)^T
        cblas_sgemm(CblasColMajor, opb, opa, static_cast<int>(N), static_cast<int>(M), static_cast<int>(K), alpha,
                    B + b * sb, static_cast<int>(ldb), A + b * sa, static_cast<int>(lda), beta, C + b * sc,
                    static_cast<int>(ldc));
        continue;
      }
      cblas_sgemm(CblasRowMajor, opa, opb, static_cast<int>(M), static_cast<int>(N), static_cast<int>(K), alpha,
                  A + b * sa, static_cast<int>(lda), B + b * sb, static_cast<int>(ldb), beta, C + b * sc,
                  static_cast<int>(ldc));
    } else {
      cblas_dgemm(CblasRowMajor, opa, opb, static_cast<int>(M), static_cast<int>(N), static_cast<int>(K), alpha,
                  A + b * sa, static_cast<int>(lda), B + b * sb, static_cast<int>(ldb), beta, C + b * sc,
                  static_cast<int>(ldc));
    }
  }
}

/// C = alpha op(A) op(B) + beta C through the BLAS's bf16 GEMM (cblas_bf16_gemm().fn, which the
/// caller has checked): A and B hold bf16 values (pmt::bf16), C fp32; row-major.
inline void matmul_cblas_bf16(bool ta, bool tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
                              const void* A, std::int64_t lda, const void* B, std::int64_t ldb, float beta, float* C,
                              std::int64_t ldc) {
  cblas_bf16_gemm().fn(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                       static_cast<int>(M), static_cast<int>(N), static_cast<int>(K), alpha,
                       static_cast<const std::uint16_t*>(A), static_cast<int>(lda > 0 ? lda : 1),
                       static_cast<const std::uint16_t*>(B), static_cast<int>(ldb > 0 ? ldb : 1), beta, C,
                       static_cast<int>(ldc > 0 ? ldc : 1));
}

}  // namespace pmt::detail
#endif  // PMT_ENABLE_CBLAS
