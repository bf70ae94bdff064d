// SPDX-License-Identifier: Apache-2.0
#pragma once
// matmul and matmul_batched: C = alpha op(A) op(B) + beta C with op in {N, T}, on Views.
// Public op = validate -> early-out -> dispatch (Kokkos Kernels' gemm shape). Backends:
//   MatmulVendor    CBLAS (OpenBLAS) on host memory, cuBLAS on Kokkos::Cuda
//   MatmulPortable  pmt's team-tiled Kokkos kernel (ops/detail/matmul_kokkos.hpp), any space
//   MatmulAuto      Vendor where has_vendor_matmul_v<Exec, T>, else Portable (the default)

#include "pmt/config.hpp"
#include "pmt/core/error.hpp"
#include "pmt/core/tensor.hpp"
#include "pmt/ops/detail/matmul_cblas.hpp"
#include "pmt/ops/detail/matmul_cublas.hpp"
#include "pmt/ops/detail/matmul_kokkos.hpp"

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <string>
#include <type_traits>

namespace pmt::ops {

/// \brief Whether an operand is used as is (N) or transposed (T).
enum class Trans { N, T };

/// \brief Backend tags for matmul: Auto (default), Vendor (CBLAS / cuBLAS), Portable (Kokkos).
struct MatmulAuto {};
struct MatmulVendor {};
struct MatmulPortable {};

/// \brief True when a vendor BLAS serves matmul of T on Exec in this build.
template <class Exec, class T>
inline constexpr bool has_vendor_matmul_v =
    (std::is_same_v<T, float> || std::is_same_v<T, double>) &&
    ((PMT_ENABLE_CBLAS && is_host_space_v<Exec>)
#if PMT_ENABLE_CUDA && defined(KOKKOS_ENABLE_CUDA)
     || std::is_same_v<Exec, Kokkos::Cuda>
#endif
    );

}  // namespace pmt::ops

namespace pmt::detail {

inline std::string op_name(const char* x, ops::Trans t) {
  return t == ops::Trans::T ? std::string(x) + "^T" : std::string(x);
}

template <class Backend, class Exec, class T>
void matmul_dispatch(const Exec& exec, std::int64_t batch, ops::Trans ta, ops::Trans tb,
                     std::int64_t M, std::int64_t N, std::int64_t K, T alpha, const T* A,
                     std::int64_t lda, std::int64_t sa, const T* B, std::int64_t ldb,
                     std::int64_t sb, T beta, T* C, std::int64_t sc, const char* label) {
  constexpr bool vendor_ok = ops::has_vendor_matmul_v<Exec, T>;
  static_assert(!std::is_same_v<Backend, ops::MatmulVendor> || vendor_ok,
                "pmt::ops::matmul: MatmulVendor requested but no vendor BLAS serves this scalar "
                "type on this execution space in this build; use MatmulAuto or MatmulPortable");
  const bool at = ta == ops::Trans::T, bt = tb == ops::Trans::T;
  if constexpr (!std::is_same_v<Backend, ops::MatmulPortable> && vendor_ok) {
    if constexpr (is_host_space_v<Exec>) {
#if PMT_ENABLE_CBLAS
      (void)exec;
      (void)label;
      matmul_cblas<T>(batch, at, bt, M, N, K, alpha, A, lda, sa, B, ldb, sb, beta, C, N, sc);
      return;
#endif
    } else {
#if PMT_ENABLE_CUDA && defined(KOKKOS_ENABLE_CUDA)
      (void)label;
      matmul_cublas<T>(exec.cuda_stream(), batch, at, bt, M, N, K, alpha, A, lda, sa, B, ldb, sb,
                       beta, C, N, sc);
      return;
#endif
    }
  } else {
    matmul_portable<Exec, T>(exec, batch, M, N, K, alpha, MatmulOperand<T>{A, lda, sa, at},
                             MatmulOperand<T>{B, ldb, sb, bt}, beta, C, N, sc, label);
  }
}

}  // namespace pmt::detail

namespace pmt::ops {

// ---------------------------------------------------------------------------------------------

/// \brief C = alpha op(A) op(B) + beta C.   A: (M, K) or (K, M) if ta == T; B: (K, N) or (N, K);
/// C: (M, N). With beta == 0, C is not read (NaNs in C do not propagate).
/// \tparam Backend MatmulAuto (vendor where available), MatmulVendor or MatmulPortable.
/// Communication: none. Deterministic: yes for a given backend and thread count; the portable
/// backend is also independent of the thread count.
/// \throws pmt::ShapeError naming every shape when they do not fit, e.g.
/// `pmt::ops::matmul: A is (64, 128) but B is (256, 32); A.cols must equal B.rows`.
/// \code
/// pmt::ops::matmul(exec, Trans::N, Trans::T, 1.0f, x, w, 0.0f, y);   // y = x w^T
/// \endcode
template <class Backend = MatmulAuto, class Exec, class AV, class BV, class CV>
void matmul(const Exec& exec, Trans ta, Trans tb, typename CV::non_const_value_type alpha,
            const AV& A, const BV& B, typename CV::non_const_value_type beta, const CV& C,
            Backend = {}) {
  using T = typename CV::non_const_value_type;
  static_check_view<Exec, AV>();
  static_check_view<Exec, BV>();
  static_check_view<Exec, CV>();
  static_assert(AV::rank == 2 && BV::rank == 2 && CV::rank == 2,
                "pmt::ops::matmul: A, B and C must be rank-2 Views (use matmul_batched for rank 3)");
  static_assert(std::is_same_v<typename AV::non_const_value_type, T> &&
                    std::is_same_v<typename BV::non_const_value_type, T>,
                "pmt::ops::matmul: A, B and C must have the same scalar type");
  constexpr const char* op = "pmt::ops::matmul";
  const auto M = static_cast<std::int64_t>(ta == Trans::N ? A.extent(0) : A.extent(1));
  const auto K = static_cast<std::int64_t>(ta == Trans::N ? A.extent(1) : A.extent(0));
  const auto Kb = static_cast<std::int64_t>(tb == Trans::N ? B.extent(0) : B.extent(1));
  const auto N = static_cast<std::int64_t>(tb == Trans::N ? B.extent(1) : B.extent(0));
  const std::string a = detail::op_name("A", ta), b = detail::op_name("B", tb);
  detail::require(K == Kb, op, [&] {
    return detail::str("A is ", shape_str(A), " but B is ", shape_str(B), "; ", a, ".cols must equal ",
                       b, ".rows");
  });
  detail::require(C.extent(0) == static_cast<std::size_t>(M) && C.extent(1) == static_cast<std::size_t>(N),
                  op, [&] {
                    return detail::str("C is ", shape_str(C), " but A is ", shape_str(A), " and B is ",
                                       shape_str(B), "; C must be (", a, ".rows, ", b, ".cols) = (",
                                       M, ", ", N, ")");
                  });
  if (M == 0 || N == 0) return;
  detail::matmul_dispatch<Backend>(exec, 1, ta, tb, M, N, K, alpha, A.data(),
                                   static_cast<std::int64_t>(A.extent(1)), 0, B.data(),
                                   static_cast<std::int64_t>(B.extent(1)), 0, beta, C.data(), 0, op);
}

/// \brief C[b] = alpha op(A[b]) op(B[b]) + beta C[b] for every b: rank-3 Views (batch, rows, cols)
/// with the same batch extent (strided batched gemm, as attention uses).
/// \throws pmt::ShapeError naming every shape when they do not fit.
template <class Backend = MatmulAuto, class Exec, class AV, class BV, class CV>
void matmul_batched(const Exec& exec, Trans ta, Trans tb, typename CV::non_const_value_type alpha,
                    const AV& A, const BV& B, typename CV::non_const_value_type beta, const CV& C,
                    Backend = {}) {
  static_check_view<Exec, AV>();
  static_check_view<Exec, BV>();
  static_check_view<Exec, CV>();
  static_assert(AV::rank == 3 && BV::rank == 3 && CV::rank == 3,
                "pmt::ops::matmul_batched: A, B and C must be rank-3 Views (batch, rows, cols)");
  constexpr const char* op = "pmt::ops::matmul_batched";
  const auto batch = static_cast<std::int64_t>(C.extent(0));
  const auto M     = static_cast<std::int64_t>(ta == Trans::N ? A.extent(1) : A.extent(2));
  const auto K     = static_cast<std::int64_t>(ta == Trans::N ? A.extent(2) : A.extent(1));
  const auto Kb    = static_cast<std::int64_t>(tb == Trans::N ? B.extent(1) : B.extent(2));
  const auto N     = static_cast<std::int64_t>(tb == Trans::N ? B.extent(2) : B.extent(1));
  const std::string a = detail::op_name("A", ta), b = detail::op_name("B", tb);
  detail::require(A.extent(0) == C.extent(0) && B.extent(0) == C.extent(0), op, [&] {
    return detail::str("A is ", shape_str(A), ", B is ", shape_str(B), ", C is ", shape_str(C),
                       "; the batch extents (dim 0) must be equal");
  });
  detail::require(K == Kb, op, [&] {
    return detail::str("A is ", shape_str(A), " but B is ", shape_str(B), "; ", a, ".cols must equal ",
                       b, ".rows");
  });
  detail::require(C.extent(1) == static_cast<std::size_t>(M) && C.extent(2) == static_cast<std::size_t>(N),
                  op, [&] {
                    return detail::str("C is ", shape_str(C), " but A is ", shape_str(A), " and B is ",
                                       shape_str(B), "; C must be (batch, ", a, ".rows, ", b,
                                       ".cols) = (", batch, ", ", M, ", ", N, ")");
                  });
  if (M == 0 || N == 0 || batch == 0) return;
  detail::matmul_dispatch<Backend>(
      exec, batch, ta, tb, M, N, K, alpha, A.data(), static_cast<std::int64_t>(A.extent(2)),
      static_cast<std::int64_t>(A.extent(1) * A.extent(2)), B.data(),
      static_cast<std::int64_t>(B.extent(2)), static_cast<std::int64_t>(B.extent(1) * B.extent(2)),
      beta, C.data(), M * N, op);
}

}  // namespace pmt::ops
