// SPDX-License-Identifier: Apache-2.0
#pragma once
// The vendor matmul on CUDA device memory: cuBLAS sgemm/dgemm (strided-batched) and the bf16
// GEMM (cublasGemmEx, fp32 sums), enqueued on the caller's stream. Row-major C = op(A) op(B) is
// computed as column-major C^T = op(B)^T op(A)^T.
// Host-compiled (g++ against the toolkit headers); Kokkos::Cuda code hands over its stream.

#include "pmt/config.hpp"

#if PMT_ENABLE_CUDA
#include "pmt/core/error.hpp"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <type_traits>

namespace pmt::detail {

inline void check_cublas(cublasStatus_t status, const char* call) {
  require<ConfigError>(status == CUBLAS_STATUS_SUCCESS, "pmt::ops::matmul",
                       [&] { return std::string(call) + " failed: " + cublasGetStatusString(status); });
}

/// One cuBLAS handle per host thread, created on first use (cublasCreate fails cleanly, with a
/// pmt::ConfigError, where no CUDA device is present).
inline cublasHandle_t cublas_handle() {
  struct Handle {
    cublasHandle_t h = nullptr;
    ~Handle() {
      if (h) cublasDestroy(h);
    }
  };
  thread_local Handle handle;
  if (!handle.h) check_cublas(cublasCreate(&handle.h), "cublasCreate");
  return handle.h;
}

/// C[b] = alpha op(A[b]) op(B[b]) + beta C[b] on `stream`; row-major operands in device memory.
template <class T>
void matmul_cublas(cudaStream_t stream, std::int64_t batch, bool ta, bool tb, std::int64_t M, std::int64_t N,
                   std::int64_t K, T alpha, const T* A, std::int64_t lda, std::int64_t sa, const T* B, std::int64_t ldb,
                   std::int64_t sb, T beta, T* C, std::int64_t ldc, std::int64_t sc) {
  cublasHandle_t h = cublas_handle();
  check_cublas(cublasSetStream(h, stream), "cublasSetStream");
  const cublasOperation_t opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int n = static_cast<int>(N), m = static_cast<int>(M), k = static_cast<int>(K);
  if constexpr (std::is_same_v<T, float>) {
    check_cublas(
        cublasSgemmStridedBatched(h, opb, opa, n, m, k, &alpha, B, static_cast<int>(ldb), sb, A, static_cast<int>(lda),
                                  sa, &beta, C, static_cast<int>(ldc), sc, static_cast<int>(batch)),
        "cublasSgemmStridedBatched");
  } else {
    static_assert(std::is_same_v<T, double>, "pmt::ops::matmul: cuBLAS path supports float and double");
    check_cublas(
        cublasDgemmStridedBatched(h, opb, opa, n, m, k, &alpha, B, static_cast<int>(ldb), sb, A, static_cast<int>(lda),
                                  sa, &beta, C, static_cast<int>(ldc), sc, static_cast<int>(batch)),
        "cublasDgemmStridedBatched");
  }
}

/// C = alpha op(A) op(B) + beta C on `stream`, A and B bf16 (their bits, row-major, in device
/// memory), C float: cublasGemmEx with fp32 products and sums (CUBLAS_COMPUTE_32F; tensor cores
/// where the GPU has them). With beta == 0, C is not read.
inline void matmul_cublas_bf16(cudaStream_t stream, bool ta, bool tb, std::int64_t M, std::int64_t N, std::int64_t K,
                               float alpha, const void* A, std::int64_t lda, const void* B, std::int64_t ldb,
                               float beta, float* C, std::int64_t ldc) {
  cublasHandle_t h = cublas_handle();
  check_cublas(cublasSetStream(h, stream), "cublasSetStream");
  check_cublas(cublasGemmEx(h, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(N),
                            static_cast<int>(M), static_cast<int>(K), &alpha, B, CUDA_R_16BF, static_cast<int>(ldb), A,
                            CUDA_R_16BF, static_cast<int>(lda), &beta, C, CUDA_R_32F, static_cast<int>(ldc),
                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "cublasGemmEx (bf16)");
}

}  // namespace pmt::detail
#endif  // PMT_ENABLE_CUDA
