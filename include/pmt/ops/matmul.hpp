// SPDX-License-Identifier: Apache-2.0
#pragma once
// matmul and matmul_batched: C = alpha op(A) op(B) + beta C with op in {N, T}, on Views.
// Public op = validate -> early-out -> dispatch (Kokkos Kernels' gemm shape). Backends:
//   MatmulVendor    CBLAS (OpenBLAS) on host memory, cuBLAS on Kokkos::Cuda
//   MatmulPortable  pmt's team-tiled Kokkos kernel (ops/detail/matmul_kokkos.hpp), any space
//   MatmulAuto      the default: where both paths exist, the faster for the call's shape class,
//                   measured on first use (core/measured_choice.hpp: decided at once in a job of
//                   one rank, agreed over all ranks by comm::agree_choices in a larger job, the
//                   vendor path running until then); Portable where no vendor BLAS serves.
// The auto choice can be pinned for the whole process: PMT_MATMUL=vendor|portable|auto in the
// environment, or pmt::ops::set_matmul_path(MatmulPath::Vendor) in code. A pinned path (or an
// explicit MatmulVendor / MatmulPortable tag on a call) measures nothing.
// bf16 mixed precision: matmul_bf16 (and matmul on float Views inside a pmt::PrecisionScope of
// Precision::bf16, core/precision.hpp) computes C = alpha bf16(op(A)) bf16(op(B)) + beta C: each
// operand element rounded to the nearest bf16 (ties to even, as pmt::bf16), the products summed
// in fp32. A product of two bf16 values is exact in fp32, so every path computes the same sum in
// its own fp32 order. Paths:
//   MatmulAuto      on a host space, pmt's kernel: AMX tiles where the CPU has AMX-BF16 and the
//                   kernel grants the tile state, else AVX512-BF16 dot products where it has
//                   those and they beat the rounded path (ops/detail/host_bf16.hpp; the same bits
//                   for any thread count), else the rounded path; and where the linked BLAS has a
//                   bf16 GEMM (OpenBLAS' cblas_sbgemm, MKL's cblas_gemm_bf16bf16f32) on bf16
//                   copies of the operands, that GEMM instead for the shape classes where it is
//                   measured faster (as matmul's paths; none is measured under a pinned matmul
//                   path). On Kokkos::Cuda cuBLAS's bf16 GEMM (cublasGemmEx, fp32 sums) on bf16
//                   copies of the operands; elsewhere the rounded path.
//                   set_bf16_kernel / PMT_BF16_MATMUL pin one (rounded: the rounded path on CUDA;
//                   vendor: the BLAS's bf16 GEMM)
//   MatmulVendor,   the rounded path: op(A) and op(B) rounded into fp32 workspace copies, then the
//   MatmulPortable  fp32 product of that backend (the reference the AMX path is tested against)
// bf16_matmul_isa<Exec>() names pmt's kernel or the pinned one ("amx-bf16", "avx512-bf16",
// "cublas-bf16", "vendor-bf16" or "rounded-fp32"); matmul_path_summary() the shape classes that
// took the BLAS's bf16 GEMM.
// matmul_batched (attention's score products) always computes in the Views' own type.

#include "pmt/config.hpp"
#include "pmt/core/bf16.hpp"
#include "pmt/core/error.hpp"
#include "pmt/core/measured_choice.hpp"
#include "pmt/core/precision.hpp"
#include "pmt/core/step_context.hpp"
#include "pmt/core/tensor.hpp"
#include "pmt/core/workspace.hpp"
#include "pmt/ops/detail/host_bf16.hpp"
#include "pmt/ops/detail/matmul_cblas.hpp"
#include "pmt/ops/detail/matmul_cublas.hpp"
#include "pmt/ops/detail/matmul_kokkos.hpp"
#include "pmt/ops/matmul_paths.hpp"

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <string>
#include <type_traits>

namespace pmt::detail {

inline std::string op_name(const char* x, ops::Trans t) {
  return t == ops::Trans::T ? std::string(x) + "^T" : std::string(x);
}

struct MatmulDims {
  std::int64_t batch, M, N, K;
};

/// Checks the shapes of C = op(A) op(B) for rank-2 Views or rank-3 (batch, rows, cols) Views and
/// returns the sizes; throws ShapeError naming every shape.
template <class AV, class BV, class CV>
MatmulDims matmul_dims(const char* op, ops::Trans ta, ops::Trans tb, const AV& A, const BV& B, const CV& C) {
  constexpr std::size_t o  = CV::rank == 3 ? 1 : 0;  // first matrix dim
  const auto ext           = [](const auto& v, std::size_t d) { return static_cast<std::int64_t>(v.extent(d)); };
  const std::int64_t batch = o == 1 ? ext(C, 0) : 1;
  const std::int64_t M     = ta == ops::Trans::N ? ext(A, o) : ext(A, o + 1);
  const std::int64_t K     = ta == ops::Trans::N ? ext(A, o + 1) : ext(A, o);
  const std::int64_t Kb    = tb == ops::Trans::N ? ext(B, o) : ext(B, o + 1);
  const std::int64_t N     = tb == ops::Trans::N ? ext(B, o + 1) : ext(B, o);
  const std::string a = op_name("A", ta), b = op_name("B", tb);
  if constexpr (o == 1) {
    require(ext(A, 0) == batch && ext(B, 0) == batch, op, [&] {
      return str("A is ", shape_str(A), ", B is ", shape_str(B), ", C is ", shape_str(C),
                 "; the batch extents (dim 0) must be equal");
    });
  }
  require(K == Kb, op, [&] {
    return str("A is ", shape_str(A), " but B is ", shape_str(B), "; ", a, ".cols must equal ", b, ".rows");
  });
  require(ext(C, o) == M && ext(C, o + 1) == N, op, [&] {
    return str("C is ", shape_str(C), " but A is ", shape_str(A), " and B is ", shape_str(B), "; C must be (",
               o == 1 ? "batch, " : "", a, ".rows, ", b, ".cols) = (",
               o == 1 ? std::to_string(batch) + ", " : std::string(), M, ", ", N, ")");
  });
  return MatmulDims{batch, M, N, K};
}

template <class Backend, class Exec, class T>
void matmul_dispatch(const Exec& exec, std::int64_t batch, ops::Trans ta, ops::Trans tb, std::int64_t M, std::int64_t N,
                     std::int64_t K, T alpha, const T* A, std::int64_t lda, std::int64_t sa, const T* B,
                     std::int64_t ldb, std::int64_t sb, T beta, T* C, std::int64_t sc, const char* label) {
  constexpr bool vendor_ok = ops::has_vendor_matmul_v<Exec, T>;
  static_assert(!std::is_same_v<Backend, ops::MatmulVendor> || vendor_ok,
                "pmt::ops::matmul: MatmulVendor requested but no vendor BLAS serves this scalar "
                "type on this execution space in this build; use MatmulAuto or MatmulPortable");
  const bool at = ta == ops::Trans::T, bt = tb == ops::Trans::T;
  if constexpr (std::is_same_v<Backend, ops::MatmulAuto> && vendor_ok) {
    const ops::MatmulPath pin = ops::matmul_path();
    bool portable             = pin == ops::MatmulPath::Portable;
    // one product into `out` on the vendor path or the portable one
    const auto product = [&](bool portable_path, T* out) {
      if (portable_path)
        matmul_dispatch<ops::MatmulPortable>(exec, batch, ta, tb, M, N, K, alpha, A, lda, sa, B, ldb, sb, beta, out, sc,
                                             label);
      else
        matmul_dispatch<ops::MatmulVendor>(exec, batch, ta, tb, M, N, K, alpha, A, lda, sa, B, ldb, sb, beta, out, sc,
                                           label);
    };
    if (pin == ops::MatmulPath::Auto) {
      const auto shape = [&] {  // built only when the class is measured
        return str(batch > 1 ? str(batch, "x") : std::string(), M, "x", N, "x", K, " ", at ? "T" : "N", bt ? "T" : "N",
                   sizeof(T) == 4 ? " fp32" : " fp64");
      };
      const double flops = 2.0 * double(batch) * double(M) * double(N) * double(K);
      Kokkos::View<T*, typename Exec::memory_space> scratch;  // allocated in the first (warm) round
      portable = measured_choice(ops::matmul_choice_key<Exec, T>(batch, ta, tb, M, N, K), shape, flops, [&](int path) {
                   // into scratch (zeros: beta C is read, and stays finite), never into C
                   if (scratch.data() == nullptr)
                     scratch = Kokkos::View<T*, typename Exec::memory_space>("pmt::ops::matmul::measure",
                                                                             std::size_t(batch * M * N));
                   exec.fence();
                   product(path == 1, scratch.data());
                   exec.fence();
                 }) == 1;
    }
    product(portable, C);
  } else if constexpr (!std::is_same_v<Backend, ops::MatmulPortable> && vendor_ok) {
    if constexpr (is_host_space_v<Exec>) {
#if PMT_ENABLE_CBLAS
      if (batch > 1 && batch >= exec.concurrency() && exec.concurrency() > 1) {
        // Many products (attention's B·H heads): one single-threaded BLAS call per product, the
        // products spread over the space's threads (OpenMP OpenBLAS runs one thread when called
        // inside a parallel region), instead of B·H small calls each split over all threads.
        Kokkos::parallel_for(label, Kokkos::RangePolicy<Exec>(exec, 0, batch), [=](std::int64_t b) {
          matmul_cblas<T>(1, at, bt, M, N, K, alpha, A + b * sa, lda, sa, B + b * sb, ldb, sb, beta, C + b * sc, N, sc);
        });
        return;
      }
      (void)label;
      matmul_cblas<T>(batch, at, bt, M, N, K, alpha, A, lda, sa, B, ldb, sb, beta, C, N, sc);
      return;
#endif
    } else {
#if PMT_ENABLE_CUDA && defined(KOKKOS_ENABLE_CUDA)
      (void)label;
      matmul_cublas<T>(exec.cuda_stream(), batch, at, bt, M, N, K, alpha, A, lda, sa, B, ldb, sb, beta, C, N, sc);
      return;
#endif
    }
  } else {
    matmul_portable<Exec, T>(exec, batch, M, N, K, alpha, MatmulOperand<T>{A, lda, sa, at},
                             MatmulOperand<T>{B, ldb, sb, bt}, beta, C, N, sc, label);
  }
}

#if PMT_HOST_AMX
/// C = alpha bf16(op(A)) bf16(op(B)) + beta C with the host kernel `amx` (AMX tiles) or not
/// (AVX512-BF16) on a host space (ops/detail/host_bf16.hpp).
template <class Exec>
void matmul_bf16_host(const Exec& exec, bool amx, bool at, bool bt, std::int64_t M, std::int64_t N, std::int64_t K,
                      float alpha, const float* A, std::int64_t lda, const float* B, std::int64_t ldb, float beta,
                      float* C, std::int64_t ldc) {
  namespace hb = hostbf16;
  const hb::Packing p(M, N, K);
  std::uint16_t* Ap = hb::buffer(0, p.a_elems());
  std::uint16_t* Bp = hb::buffer(1, p.b_elems());
  using Policy      = Kokkos::RangePolicy<Exec>;
  Kokkos::parallel_for("pmt::ops::matmul_bf16::pack_b", Policy(exec, 0, p.nb),
                       [=](std::int64_t c) { hb::pack_b(p, c, B, ldb, bt, Bp); });
  Kokkos::parallel_for("pmt::ops::matmul_bf16::pack_a", Policy(exec, 0, p.mb),
                       [=](std::int64_t r) { hb::pack_a(p, r, A, lda, at, Ap); });
  // Work items: (group of row blocks, pair of column blocks), row-group major, a contiguous run
  // per thread: a thread keeps its rows' packed A (up to 1 MiB a group) in its L2 while it sweeps
  // the columns. Each C block is one item: its sums do not depend on the thread count.
  const std::int64_t block_bytes = p.kb * 32 * 32 * 2;  // one packed 32-row block of A
  std::int64_t group             = (std::int64_t(1) << 20) / (block_bytes > 0 ? block_bytes : 1);
  group                          = group < 1 ? 1 : (group > 8 ? 8 : group);
  const std::int64_t groups = (p.mb + group - 1) / group, pairs = p.nb / 2, items = groups * pairs;
  const std::int64_t threads = exec.concurrency() < items ? exec.concurrency() : items;
  Kokkos::parallel_for(amx ? "pmt::ops::matmul_bf16::amx" : "pmt::ops::matmul_bf16::avx512bf16",
                       Policy(exec, 0, threads), [=](std::int64_t t) {
                         const std::int64_t i0 = items * t / threads, i1 = items * (t + 1) / threads;
                         if (amx) hb::configure();
                         for (std::int64_t i = i0; i < i1; ++i) {
                           const std::int64_t g = i / pairs, c = i % pairs;
                           const std::int64_t r1 = (g + 1) * group < p.mb ? (g + 1) * group : p.mb;
                           for (std::int64_t r = g * group; r < r1; ++r) {
                             if (amx)
                               hb::amx_block(p, r, c, Ap, Bp, alpha, beta, C, ldc);
                             else
                               hb::avx512_block(p, r, c, Ap, Bp, alpha, beta, C, ldc);
                           }
                         }
                         if (amx) hb::release();
                       });
  exec.fence();
}
#endif

/// dst = src rounded to the nearest bf16, in dst's value type, elementwise over a rank-2 View:
/// float (the rounded path's operand copies) or bf16 (cuBLAS's bf16 operands).
template <class Exec, class SV, class DV>
void round_to_bf16(const Exec& exec, const SV& src, const DV& dst) {
  using D                 = typename DV::non_const_value_type;
  const std::int64_t cols = static_cast<std::int64_t>(src.extent(1));
  Kokkos::parallel_for(
      "pmt::ops::matmul_bf16::round", Kokkos::RangePolicy<Exec>(exec, 0, std::int64_t(src.extent(0))),
      KOKKOS_LAMBDA(std::int64_t i) {
        for (std::int64_t j = 0; j < cols; ++j) dst(i, j) = static_cast<D>(bf16(float(src(i, j))));
      });
}

/// The bf16 product of float rank-2 Views whose shapes matmul_dims has checked (see the file
/// comment for the paths).
template <class Backend, class Exec, class AV, class BV, class CV>
void matmul_bf16_views(const Exec& exec, ops::Trans ta, ops::Trans tb, const MatmulDims& d, float alpha, const AV& A,
                       const BV& B, float beta, const CV& C) {
  const auto ld = [](const auto& v) { return static_cast<std::int64_t>(v.extent(1)); };
  // the rounded path into `out` (C's shape, contiguous rows)
  const auto rounded = [&](float* out) {
    using V2     = Kokkos::View<float**, Kokkos::LayoutRight, typename CV::memory_space>;
    const auto a = workspace_view<V2>("pmt::ops::matmul_bf16::a", A.extent(0), A.extent(1));
    const auto b = workspace_view<V2>("pmt::ops::matmul_bf16::b", B.extent(0), B.extent(1));
    round_to_bf16(exec, A, a);
    round_to_bf16(exec, B, b);
    matmul_dispatch<Backend>(exec, 1, ta, tb, d.M, d.N, d.K, alpha, a.data(), ld(a), 0, b.data(), ld(b), 0, beta, out,
                             0, "pmt::ops::matmul_bf16");
  };
  if constexpr (std::is_same_v<Backend, ops::MatmulAuto> && is_host_space_v<Exec>) {
    [[maybe_unused]] const ops::Bf16Kernel k = ops::bf16_kernel<Exec>();
    [[maybe_unused]] const bool pinned       = ops::bf16_kernel_setting() != ops::Bf16Kernel::automatic;
    // times path 0 against path 1 of `op` for this shape class (into scratch, never into C);
    // true where path 1 is taken
    Kokkos::View<float*, typename CV::memory_space> scratch;  // zeros: beta C is read, and stays finite
    [[maybe_unused]] const auto measure = [&](std::int64_t op, const char* what, auto&& path_into) {
      ChoiceKey key    = ops::matmul_choice_key<Exec, float>(1, ta, tb, d.M, d.N, d.K);
      key.op           = op;
      const auto shape = [&] {
        return str(d.M, "x", d.N, "x", d.K, " ", ta == ops::Trans::T ? "T" : "N", tb == ops::Trans::T ? "T" : "N", " ",
                   what);
      };
      return measured_choice(key, shape, 2.0 * double(d.M) * double(d.N) * double(d.K), [&](int path) {
               if (scratch.data() == nullptr)
                 scratch = Kokkos::View<float*, typename CV::memory_space>("pmt::ops::matmul_bf16::measure",
                                                                           std::size_t(d.M * d.N));
               exec.fence();
               path_into(path, scratch.data());
               exec.fence();
             }) == 1;
    };
    // pmt's kernel: AMX tiles; AVX512-BF16 dot products where pinned or timed faster than the
    // rounded path; else the rounded path
#if PMT_HOST_AMX
    const auto kernel = [&](float* out) {
      matmul_bf16_host(exec, k == ops::Bf16Kernel::amx, ta == ops::Trans::T, tb == ops::Trans::T, d.M, d.N, d.K, alpha,
                       A.data(), ld(A), B.data(), ld(B), beta, out, ld(C));
    };
    const bool own_kernel =
        k == ops::Bf16Kernel::amx ||
        (k == ops::Bf16Kernel::avx512bf16 && (pinned || measure(ops::bf16_choice_op, "bf16", [&](int path, float* out) {
                                                path == 1 ? kernel(out) : rounded(out);
                                              })));
#endif
    const auto own = [&](float* out) {
#if PMT_HOST_AMX
      if (own_kernel) return kernel(out);
#endif
      rounded(out);
    };
#if PMT_ENABLE_CBLAS
    // the BLAS's bf16 GEMM on bf16 copies of the operands: pinned, or timed against pmt's kernel
    // (unless a matmul path is pinned); its copies live in the workspace only once it is taken
    if (detail::cblas_bf16_gemm().fn != nullptr && d.M > 0 && d.N > 0 && d.K > 0) {
      const auto vendor = [&](float* out, bool kept) {
        using H      = Kokkos::View<bf16**, Kokkos::LayoutRight, typename CV::memory_space>;
        const auto a = kept ? workspace_view<H>("pmt::ops::matmul_bf16::a16", A.extent(0), A.extent(1))
                            : H("pmt::ops::matmul_bf16::measure_a16", A.extent(0), A.extent(1));
        const auto b = kept ? workspace_view<H>("pmt::ops::matmul_bf16::b16", B.extent(0), B.extent(1))
                            : H("pmt::ops::matmul_bf16::measure_b16", B.extent(0), B.extent(1));
        round_to_bf16(exec, A, a);
        round_to_bf16(exec, B, b);
        exec.fence();
        matmul_cblas_bf16(ta == ops::Trans::T, tb == ops::Trans::T, d.M, d.N, d.K, alpha, a.data(), ld(a), b.data(),
                          ld(b), beta, out, ld(C));
      };
      const bool use = k == ops::Bf16Kernel::vendor ||
                       (!pinned && ops::matmul_path() == ops::MatmulPath::Auto &&
                        measure(ops::bf16_vendor_choice_op, "bf16 vendor",
                                [&](int path, float* out) { path == 1 ? vendor(out, false) : own(out); }));
      if (use) return vendor(C.data(), true);
    }
#endif
    return own(C.data());
  }
#if PMT_ENABLE_CUDA && defined(KOKKOS_ENABLE_CUDA)
  if constexpr (std::is_same_v<Backend, ops::MatmulAuto> && std::is_same_v<Exec, Kokkos::Cuda>) {
    if (ops::bf16_kernel<Exec>() == ops::Bf16Kernel::cublas) {
      // bf16 copies of the operands, then cuBLAS's bf16 GEMM with fp32 sums into C
      using H      = Kokkos::View<bf16**, Kokkos::LayoutRight, typename CV::memory_space>;
      const auto a = workspace_view<H>("pmt::ops::matmul_bf16::a16", A.extent(0), A.extent(1));
      const auto b = workspace_view<H>("pmt::ops::matmul_bf16::b16", B.extent(0), B.extent(1));
      round_to_bf16(exec, A, a);
      round_to_bf16(exec, B, b);
      matmul_cublas_bf16(exec.cuda_stream(), ta == ops::Trans::T, tb == ops::Trans::T, d.M, d.N, d.K, alpha, a.data(),
                         ld(a), b.data(), ld(b), beta, C.data(), ld(C));
      return;
    }
  }
#endif
  rounded(C.data());
}

}  // namespace pmt::detail

namespace pmt::ops {

// ---------------------------------------------------------------------------------------------

/// \brief C = alpha op(A) op(B) + beta C.   A: (M, K) or (K, M) if ta == T; B: (K, N) or (N, K);
/// C: (M, N). With beta == 0, C is not read (NaNs in C do not propagate). Float Views inside a
/// PrecisionScope of Precision::bf16 take matmul_bf16.
/// \tparam Backend MatmulAuto (vendor where available), MatmulVendor or MatmulPortable.
/// Communication: none. Deterministic: yes for a given backend and thread count; the portable
/// backend is also independent of the thread count.
/// \throws pmt::ShapeError naming every shape when they do not fit, e.g.
/// `pmt::ops::matmul: A is (64, 128) but B is (256, 32); A.cols must equal B.rows`.
/// \code
/// pmt::ops::matmul(exec, Trans::N, Trans::T, 1.0f, x, w, 0.0f, y);   // y = x w^T
/// \endcode
template <class Backend = MatmulAuto, class Exec, class AV, class BV, class CV>
void matmul(const Exec& exec, Trans ta, Trans tb, typename CV::non_const_value_type alpha, const AV& A, const BV& B,
            typename CV::non_const_value_type beta, const CV& C, Backend = {}) {
  using T = typename CV::non_const_value_type;
  static_check_view<Exec, AV>();
  static_check_view<Exec, BV>();
  static_check_view<Exec, CV>();
  static_assert(AV::rank == 2 && BV::rank == 2 && CV::rank == 2,
                "pmt::ops::matmul: A, B and C must be rank-2 Views (use matmul_batched for rank 3)");
  static_assert(
      std::is_same_v<typename AV::non_const_value_type, T> && std::is_same_v<typename BV::non_const_value_type, T>,
      "pmt::ops::matmul: A, B and C must have the same scalar type");
  constexpr const char* op   = "pmt::ops::matmul";
  const detail::MatmulDims d = detail::matmul_dims(op, ta, tb, A, B, C);
  if (d.M == 0 || d.N == 0) return;
  if constexpr (std::is_same_v<T, float>)
    if (step_context().precision == Precision::bf16)
      return detail::matmul_bf16_views<Backend>(exec, ta, tb, d, alpha, A, B, beta, C);
  detail::matmul_dispatch<Backend>(exec, 1, ta, tb, d.M, d.N, d.K, alpha, A.data(),
                                   static_cast<std::int64_t>(A.extent(1)), 0, B.data(),
                                   static_cast<std::int64_t>(B.extent(1)), 0, beta, C.data(), 0, op);
}

/// \brief C[b] = alpha op(A[b]) op(B[b]) + beta C[b] for every b: rank-3 Views (batch, rows, cols)
/// with the same batch extent (strided batched gemm, as attention uses).
/// \throws pmt::ShapeError naming every shape when they do not fit.
template <class Backend = MatmulAuto, class Exec, class AV, class BV, class CV>
void matmul_batched(const Exec& exec, Trans ta, Trans tb, typename CV::non_const_value_type alpha, const AV& A,
                    const BV& B, typename CV::non_const_value_type beta, const CV& C, Backend = {}) {
  static_check_view<Exec, AV>();
  static_check_view<Exec, BV>();
  static_check_view<Exec, CV>();
  static_assert(AV::rank == 3 && BV::rank == 3 && CV::rank == 3,
                "pmt::ops::matmul_batched: A, B and C must be rank-3 Views (batch, rows, cols)");
  constexpr const char* op   = "pmt::ops::matmul_batched";
  const detail::MatmulDims d = detail::matmul_dims(op, ta, tb, A, B, C);
  if (d.M == 0 || d.N == 0 || d.batch == 0) return;
  detail::matmul_dispatch<Backend>(
      exec, d.batch, ta, tb, d.M, d.N, d.K, alpha, A.data(), static_cast<std::int64_t>(A.extent(2)),
      static_cast<std::int64_t>(A.extent(1) * A.extent(2)), B.data(), static_cast<std::int64_t>(B.extent(2)),
      static_cast<std::int64_t>(B.extent(1) * B.extent(2)), beta, C.data(), d.M * d.N, op);
}

}  // namespace pmt::ops

namespace pmt::ops {

/// \brief C = alpha bf16(op(A)) bf16(op(B)) + beta C with fp32 sums, whatever the PrecisionScope
/// (see the file comment for its paths). A, B, C: float, rank 2, shaped as for matmul; with
/// beta == 0, C is not read.
/// \throws pmt::ShapeError naming every shape when they do not fit.
/// \code
/// pmt::ops::matmul_bf16(exec, Trans::N, Trans::N, 1.0f, x, w, 0.0f, y);   // y = bf16(x) bf16(w)
/// \endcode
template <class Backend = MatmulAuto, class Exec, class AV, class BV, class CV>
void matmul_bf16(const Exec& exec, Trans ta, Trans tb, float alpha, const AV& A, const BV& B, float beta, const CV& C,
                 Backend = {}) {
  static_check_view<Exec, AV>();
  static_check_view<Exec, BV>();
  static_check_view<Exec, CV>();
  static_assert(AV::rank == 2 && BV::rank == 2 && CV::rank == 2,
                "pmt::ops::matmul_bf16: A, B and C must be rank-2 Views");
  static_assert(std::is_same_v<typename AV::non_const_value_type, float> &&
                    std::is_same_v<typename BV::non_const_value_type, float> &&
                    std::is_same_v<typename CV::non_const_value_type, float>,
                "pmt::ops::matmul_bf16: A, B and C must be float Views (the operands are rounded to bf16)");
  const detail::MatmulDims d = detail::matmul_dims("pmt::ops::matmul_bf16", ta, tb, A, B, C);
  if (d.M == 0 || d.N == 0) return;
  detail::matmul_bf16_views<Backend>(exec, ta, tb, d, alpha, A, B, beta, C);
}

}  // namespace pmt::ops
