// SPDX-License-Identifier: Apache-2.0
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include "ops_test.hpp"
#include "pmt/core/bf16.hpp"
#include "pmt/core/precision.hpp"
#include "pmt/ops/matmul.hpp"

#include <limits>
#include <string>
#include <vector>

using pmt::ops::Trans;
using pmt::test::Host;

namespace {

// C(b) = alpha op(A(b)) op(B(b)) + beta C(b), in long double.
template <class A, class B, class C>
void reference(Trans ta, Trans tb, double alpha, const A& a, const B& b, double beta, const C& c) {
  const std::size_t batch = c.extent(0), M = c.extent(1), N = c.extent(2);
  const std::size_t K = ta == Trans::N ? a.extent(2) : a.extent(1);
  for (std::size_t q = 0; q < batch; ++q)
    for (std::size_t i = 0; i < M; ++i)
      for (std::size_t j = 0; j < N; ++j) {
        long double s = 0;
        for (std::size_t k = 0; k < K; ++k)
          s += static_cast<long double>(ta == Trans::N ? a(q, i, k) : a(q, k, i)) *
               static_cast<long double>(tb == Trans::N ? b(q, k, j) : b(q, j, k));
        c(q, i, j) =
            static_cast<typename C::value_type>(alpha * static_cast<double>(s) + (beta == 0 ? 0.0 : beta * c(q, i, j)));
      }
}

template <class T, class Backend>
void check_case(Backend backend, Trans ta, Trans tb, std::size_t batch, std::size_t M, std::size_t N, std::size_t K,
                double alpha, double beta, bool batched) {
  Host exec;
  auto A  = ta == Trans::N ? pmt::make_tensor<T, Host>("A", batch, M, K) : pmt::make_tensor<T, Host>("A", batch, K, M);
  auto B  = tb == Trans::N ? pmt::make_tensor<T, Host>("B", batch, K, N) : pmt::make_tensor<T, Host>("B", batch, N, K);
  auto C  = pmt::make_tensor<T, Host>("C", batch, M, N);
  auto Cr = pmt::make_tensor<T, Host>("Cref", batch, M, N);
  pmt::test::fill_random(A, 1);
  pmt::test::fill_random(B, 2);
  pmt::test::fill_random(C, 3);
  Kokkos::deep_copy(Cr, C);
  if (batched) {
    pmt::ops::matmul_batched(exec, ta, tb, static_cast<T>(alpha), A, B, static_cast<T>(beta), C, backend);
  } else {
    auto s2 = [](auto v) { return Kokkos::subview(v, 0, Kokkos::ALL, Kokkos::ALL); };
    pmt::ops::matmul(exec, ta, tb, static_cast<T>(alpha), s2(A), s2(B), static_cast<T>(beta), s2(C), backend);
  }
  exec.fence();
  reference(ta, tb, alpha, A, B, beta, Cr);
  INFO("M=" << M << " N=" << N << " K=" << K << " ta=" << (ta == Trans::T) << " tb=" << (tb == Trans::T)
            << " batch=" << batch << " alpha=" << alpha << " beta=" << beta);
  CHECK(pmt::test::max_rel_diff(C, Cr) <= 4 * pmt::test::tol<T>(static_cast<double>(K)));
}

template <class T, class Backend>
void check_backend(Backend backend) {
  struct Size {
    std::size_t M, N, K;
  };
  const std::vector<Size> sizes = {{1, 1, 1}, {37, 53, 29},  {130, 257, 300}, {7, 3, 0},
                                   {0, 5, 4}, {96, 32, 256}, {1500, 20, 270}};  // several row blocks per column panel
  for (Trans ta : {Trans::N, Trans::T})
    for (Trans tb : {Trans::N, Trans::T})
      for (const Size& s : sizes) {
        check_case<T>(backend, ta, tb, 1, s.M, s.N, s.K, 1.0, 0.0, false);
        check_case<T>(backend, ta, tb, 1, s.M, s.N, s.K, -0.5, 2.0, false);
      }
  check_case<T>(backend, Trans::N, Trans::T, 6, 33, 17, 8, 0.25, 0.0, true);
  check_case<T>(backend, Trans::T, Trans::N, 3, 20, 40, 65, 1.0, 1.0, true);
}

}  // namespace

TEMPLATE_TEST_CASE("matmul equals the reference for every backend, transpose and edge size", "[ops][matmul]", float,
                   double) {
  SECTION("portable") { check_backend<TestType>(pmt::ops::MatmulPortable{}); }
  SECTION("auto") { check_backend<TestType>(pmt::ops::MatmulAuto{}); }
#if PMT_ENABLE_CBLAS
  SECTION("vendor") { check_backend<TestType>(pmt::ops::MatmulVendor{}); }
#endif
}

namespace {
template <class Backend>
void check_beta0_ignores_nan(Backend backend) {
  Host exec;
  auto A = pmt::make_tensor<float, Host>("A", 5, 4);
  auto B = pmt::make_tensor<float, Host>("B", 4, 3);
  auto C = pmt::make_tensor<float, Host>("C", 5, 3);
  Kokkos::deep_copy(A, 1.0f);
  Kokkos::deep_copy(B, 1.0f);
  Kokkos::deep_copy(C, std::numeric_limits<float>::quiet_NaN());
  pmt::ops::matmul(exec, Trans::N, Trans::N, 1.0f, A, B, 0.0f, C, backend);
  exec.fence();
  for (int i = 0; i < 5; ++i)
    for (int j = 0; j < 3; ++j) CHECK(C(i, j) == 4.0f);
}
}  // namespace

// The vendor section matters most where the ctest entry ops_matmul_forced_openblas_core runs it
// with OPENBLAS_CORETYPE=Haswell: on an AVX-512 CPU OpenBLAS 0.3.29 then computes no small
// row-major product at all (pmt::detail::cblas_sgemm_row_major_ok).
TEST_CASE("matmul with beta = 0 does not read C", "[ops][matmul]") {
  SECTION("portable") { check_beta0_ignores_nan(pmt::ops::MatmulPortable{}); }
  SECTION("auto") { check_beta0_ignores_nan(pmt::ops::MatmulAuto{}); }
#if PMT_ENABLE_CBLAS
  SECTION("vendor") { check_beta0_ignores_nan(pmt::ops::MatmulVendor{}); }
#endif
}

TEST_CASE("the portable matmul gives bitwise the same C on 1 thread (Serial) and on OpenMP",
          "[ops][matmul][determinism]") {
#if defined(KOKKOS_ENABLE_SERIAL) && defined(KOKKOS_ENABLE_OPENMP)
  auto A  = pmt::make_tensor<float, Kokkos::OpenMP>("A", 300, 270);
  auto B  = pmt::make_tensor<float, Kokkos::OpenMP>("B", 270, 410);
  auto C1 = pmt::make_tensor<float, Kokkos::OpenMP>("C1", 300, 410);
  auto C2 = pmt::make_tensor<float, Kokkos::OpenMP>("C2", 300, 410);
  pmt::test::fill_random(A, 4);
  pmt::test::fill_random(B, 5);
  pmt::ops::matmul(Kokkos::Serial(), Trans::N, Trans::N, 1.0f, A, B, 0.0f, C1, pmt::ops::MatmulPortable{});
  pmt::ops::matmul(Kokkos::OpenMP(), Trans::N, Trans::N, 1.0f, A, B, 0.0f, C2, pmt::ops::MatmulPortable{});
  Kokkos::fence();
  INFO("OpenMP threads: " << Kokkos::OpenMP().concurrency());
  CHECK(pmt::test::bitwise_equal(C1, C2));
#else
  SKIP("needs both Kokkos::Serial and Kokkos::OpenMP");
#endif
}

TEST_CASE("matmul names the op and every shape when shapes do not fit", "[ops][matmul][errors]") {
  Host exec;
  auto A = pmt::make_tensor<float, Host>("A", 64, 128);
  auto B = pmt::make_tensor<float, Host>("B", 256, 32);
  auto C = pmt::make_tensor<float, Host>("C", 64, 32);
  using Catch::Matchers::StartsWith;
  CHECK_THROWS_WITH(pmt::ops::matmul(exec, Trans::N, Trans::N, 1.0f, A, B, 0.0f, C),
                    StartsWith("pmt::ops::matmul: A is (64, 128) but B is (256, 32); A.cols must equal B.rows"));
  auto B2 = pmt::make_tensor<float, Host>("B2", 128, 32);
  auto C2 = pmt::make_tensor<float, Host>("C2", 64, 31);
  CHECK_THROWS_WITH(pmt::ops::matmul(exec, Trans::N, Trans::N, 1.0f, A, B2, 0.0f, C2),
                    StartsWith("pmt::ops::matmul: C is (64, 31) but A is (64, 128) and B is (128, 32); "
                               "C must be (A.rows, B.cols) = (64, 32)"));
  auto A3 = pmt::make_tensor<float, Host>("A3", 2, 4, 5);
  auto B3 = pmt::make_tensor<float, Host>("B3", 3, 5, 6);
  auto C3 = pmt::make_tensor<float, Host>("C3", 2, 4, 6);
  CHECK_THROWS_WITH(pmt::ops::matmul_batched(exec, Trans::N, Trans::N, 1.0f, A3, B3, 0.0f, C3),
                    StartsWith("pmt::ops::matmul_batched: A is (2, 4, 5), B is (3, 5, 6), C is (2, 4, 6); "
                               "the batch extents (dim 0) must be equal"));
  auto B4 = pmt::make_tensor<float, Host>("B4", 2, 6, 5);
  CHECK_THROWS_WITH(pmt::ops::matmul_batched(exec, Trans::N, Trans::T, 1.0f, A3, B4, 0.0f, A3),
                    StartsWith("pmt::ops::matmul_batched: C is (2, 4, 5) but A is (2, 4, 5) and B is (2, 6, 5); "
                               "C must be (batch, A.rows, B^T.cols) = (2, 4, 6)"));
}

// ---------------------------------------------------------------------------------------------
// bf16 mixed precision: C = alpha bf16(op(A)) bf16(op(B)) + beta C with fp32 sums

namespace {

// The reference: the operands rounded to bf16 (pmt::bf16, independently of the paths' rounding),
// the products summed in long double.
template <class V>
V rounded_copy(const V& v) {
  V r(v.label() + "_bf16", v.layout());
  auto f = pmt::detail::flat(v);
  auto g = pmt::detail::flat(r);
  for (std::size_t i = 0; i < f.extent(0); ++i) g(i) = float(pmt::bf16(f(i)));
  return r;
}

template <class Backend>
void check_bf16_case(Backend backend, Trans ta, Trans tb, std::size_t M, std::size_t N, std::size_t K, double alpha,
                     double beta) {
  Host exec;
  auto A  = ta == Trans::N ? pmt::make_tensor<float, Host>("A", 1, M, K) : pmt::make_tensor<float, Host>("A", 1, K, M);
  auto B  = tb == Trans::N ? pmt::make_tensor<float, Host>("B", 1, K, N) : pmt::make_tensor<float, Host>("B", 1, N, K);
  auto C  = pmt::make_tensor<float, Host>("C", 1, M, N);
  auto Cr = pmt::make_tensor<float, Host>("Cref", 1, M, N);
  pmt::test::fill_random(A, 11);
  pmt::test::fill_random(B, 12);
  pmt::test::fill_random(C, 13);
  Kokkos::deep_copy(Cr, C);
  auto s2 = [](auto v) { return Kokkos::subview(v, 0, Kokkos::ALL, Kokkos::ALL); };
  pmt::ops::matmul_bf16(exec, ta, tb, float(alpha), s2(A), s2(B), float(beta), s2(C), backend);
  exec.fence();
  reference(ta, tb, alpha, rounded_copy(A), rounded_copy(B), beta, Cr);
  INFO("path " << pmt::ops::bf16_matmul_isa<Host>() << " M=" << M << " N=" << N << " K=" << K
               << " ta=" << (ta == Trans::T) << " tb=" << (tb == Trans::T) << " alpha=" << alpha << " beta=" << beta);
  CHECK(pmt::test::max_rel_diff(C, Cr) <= 4 * pmt::test::tol<float>(static_cast<double>(K)));
}

/// Runs `body` once with each bf16 kernel this CPU (and BLAS) has pinned (AMX, AVX512-BF16,
/// rounded, the BLAS's bf16 GEMM), then unpins; returns the names of those that ran as themselves.
template <class Body>
std::string for_each_bf16_kernel(Body&& body) {
  using pmt::ops::Bf16Kernel;
  std::string ran;
  for (Bf16Kernel k : {Bf16Kernel::amx, Bf16Kernel::avx512bf16, Bf16Kernel::rounded, Bf16Kernel::vendor}) {
    pmt::ops::set_bf16_kernel(k);
    if (pmt::ops::bf16_kernel<Host>() != k) continue;  // the CPU lacks it
    ran += std::string(ran.empty() ? "" : " ") + pmt::ops::bf16_kernel_name(k);
    body();
  }
  pmt::ops::set_bf16_kernel(Bf16Kernel::automatic);
  return ran;
}

}  // namespace

TEST_CASE("matmul_bf16 equals the product of the bf16-rounded operands for every kernel, path, transpose and edge size",
          "[ops][matmul][bf16]") {
  struct Size {
    std::size_t M, N, K;
  };
  // tile edges: 16 and 32 rows, 16 and 32 columns, 32 k; several row groups and column pairs
  const std::vector<Size> sizes = {{1, 1, 1}, {37, 53, 29}, {32, 32, 32},    {33, 17, 65},
                                   {7, 3, 0}, {0, 5, 4},    {130, 257, 300}, {300, 40, 1030}};
  const std::string ran         = for_each_bf16_kernel([&] {
    for (Trans ta : {Trans::N, Trans::T})
      for (Trans tb : {Trans::N, Trans::T})
        for (const Size& s : sizes) {
          check_bf16_case(pmt::ops::MatmulAuto{}, ta, tb, s.M, s.N, s.K, 1.0, 0.0);
          check_bf16_case(pmt::ops::MatmulAuto{}, ta, tb, s.M, s.N, s.K, -0.5, 2.0);
        }
  });
  INFO("kernels this CPU ran: " << ran);
  CHECK(ran.find("rounded") != std::string::npos);
  for (Trans ta : {Trans::N, Trans::T})
    for (Trans tb : {Trans::N, Trans::T})
      for (const Size& s : sizes) {
        check_bf16_case(pmt::ops::MatmulPortable{}, ta, tb, s.M, s.N, s.K, 1.0, 1.0);
#if PMT_ENABLE_CBLAS
        check_bf16_case(pmt::ops::MatmulVendor{}, ta, tb, s.M, s.N, s.K, 0.5, 1.0);
#endif
      }
}

TEST_CASE("matmul_bf16 rounds its operands to nearest even bf16 and does not read C for beta 0",
          "[ops][matmul][bf16]") {
  Host exec;
  // 1 + 2^-8 is the tie between 1 and 1 + 2^-7: it rounds to 1 (even); 1 + 3 * 2^-9 rounds up
  auto A = pmt::make_tensor<float, Host>("A", 40, 70);
  auto B = pmt::make_tensor<float, Host>("B", 70, 36);
  auto C = pmt::make_tensor<float, Host>("C", 40, 36);
  for (std::size_t i = 0; i < 40; ++i)
    for (std::size_t k = 0; k < 70; ++k) A(i, k) = k % 2 ? 1.0f + 0.00390625f : 1.0f + 3 * 0.001953125f;
  Kokkos::deep_copy(B, 1.0f);
  const float expect    = 35 * 1.0f + 35 * (1.0f + 0.0078125f);  // the rounded values, summed exactly
  const std::string ran = for_each_bf16_kernel([&] {
    Kokkos::deep_copy(C, std::numeric_limits<float>::quiet_NaN());
    pmt::ops::matmul_bf16(exec, Trans::N, Trans::N, 1.0f, A, B, 0.0f, C);
    exec.fence();
    bool all = true;
    for (std::size_t i = 0; i < 40; ++i)
      for (std::size_t j = 0; j < 36; ++j) all = all && C(i, j) == expect;
    INFO("kernel " << pmt::ops::bf16_matmul_isa<Host>());
    CHECK(all);
  });
  INFO("kernels this CPU ran: " << ran);
  CHECK(!ran.empty());
}

TEST_CASE("ops::matmul in a bf16 PrecisionScope is matmul_bf16; fp32 outside it and for double",
          "[ops][matmul][bf16]") {
  Host exec;
  auto A  = pmt::make_tensor<float, Host>("A", 50, 90);
  auto B  = pmt::make_tensor<float, Host>("B", 90, 70);
  auto C1 = pmt::make_tensor<float, Host>("C1", 50, 70);
  auto C2 = pmt::make_tensor<float, Host>("C2", 50, 70);
  auto C3 = pmt::make_tensor<float, Host>("C3", 50, 70);
  pmt::test::fill_random(A, 21);
  pmt::test::fill_random(B, 22);
  pmt::ops::matmul_bf16(exec, Trans::N, Trans::N, 1.0f, A, B, 0.0f, C1);
  {
    const pmt::PrecisionScope bf16(pmt::Precision::bf16);
    CHECK(pmt::compute_precision() == pmt::Precision::bf16);
    pmt::ops::matmul(exec, Trans::N, Trans::N, 1.0f, A, B, 0.0f, C2);
    {
      const pmt::PrecisionScope fp32(pmt::Precision::fp32);  // scopes nest
      pmt::ops::matmul(exec, Trans::N, Trans::N, 1.0f, A, B, 0.0f, C3);
    }
    CHECK(pmt::compute_precision() == pmt::Precision::bf16);
    auto Ad = pmt::make_tensor<double, Host>("Ad", 2, 2), Cd = pmt::make_tensor<double, Host>("Cd", 2, 2);
    Kokkos::deep_copy(Ad, 1.0 + 1e-6);
    pmt::ops::matmul(exec, Trans::N, Trans::N, 1.0, Ad, Ad, 0.0, Cd);
    exec.fence();
    CHECK(Cd(0, 0) == 2 * (1.0 + 1e-6) * (1.0 + 1e-6));  // double products are not rounded
  }
  CHECK(pmt::compute_precision() == pmt::Precision::fp32);
  exec.fence();
  CHECK(pmt::test::bitwise_equal(C1, C2));
  CHECK(pmt::test::max_rel_diff(C3, C1) > 1e-4);  // fp32 differs from bf16 at bf16's rounding
  CHECK_THROWS_WITH(pmt::parse_precision("fp16", "--precision"),
                    Catch::Matchers::ContainsSubstring("--precision is 'fp16'; expected fp32 or bf16"));
}

TEST_CASE("matmul_bf16 gives the same bits on one thread (Serial) as on all (OpenMP)", "[ops][matmul][bf16][spaces]") {
#if defined(KOKKOS_ENABLE_SERIAL) && defined(KOKKOS_ENABLE_OPENMP)
  for (Trans ta : {Trans::N, Trans::T}) {
    auto A  = ta == Trans::N ? pmt::make_tensor<float, Kokkos::OpenMP>("A", 300, 270)
                             : pmt::make_tensor<float, Kokkos::OpenMP>("A", 270, 300);
    auto B  = pmt::make_tensor<float, Kokkos::OpenMP>("B", 270, 410);
    auto C1 = pmt::make_tensor<float, Kokkos::OpenMP>("C1", 300, 410);
    auto C2 = pmt::make_tensor<float, Kokkos::OpenMP>("C2", 300, 410);
    pmt::test::fill_random(A, 4);
    pmt::test::fill_random(B, 5);
    // each of pmt's host kernels the CPU has; the rounded path on the portable kernel (a vendor
    // BLAS promises no thread-count independence, nor does its bf16 GEMM)
    for_each_bf16_kernel([&] {
      const pmt::ops::Bf16Kernel k = pmt::ops::bf16_kernel<Kokkos::OpenMP>();
      if (k == pmt::ops::Bf16Kernel::amx || k == pmt::ops::Bf16Kernel::avx512bf16) {
        pmt::ops::matmul_bf16(Kokkos::Serial(), ta, Trans::N, 1.0f, A, B, 0.0f, C1);
        pmt::ops::matmul_bf16(Kokkos::OpenMP(), ta, Trans::N, 1.0f, A, B, 0.0f, C2);
      } else {
        pmt::ops::matmul_bf16(Kokkos::Serial(), ta, Trans::N, 1.0f, A, B, 0.0f, C1, pmt::ops::MatmulPortable{});
        pmt::ops::matmul_bf16(Kokkos::OpenMP(), ta, Trans::N, 1.0f, A, B, 0.0f, C2, pmt::ops::MatmulPortable{});
      }
      Kokkos::fence();
      INFO("kernel " << pmt::ops::bf16_matmul_isa<Kokkos::OpenMP>()
                     << ", OpenMP threads: " << Kokkos::OpenMP().concurrency());
      CHECK(pmt::test::bitwise_equal(C1, C2));
    });
  }
#else
  SKIP("needs both Kokkos::Serial and Kokkos::OpenMP");
#endif
}
