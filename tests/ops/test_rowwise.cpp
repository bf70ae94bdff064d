// SPDX-License-Identifier: Apache-2.0
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include "ops_test.hpp"
#include "pmt/ops/cross_entropy.hpp"
#include "pmt/ops/elementwise.hpp"
#include "pmt/ops/layernorm.hpp"
#include "pmt/ops/softmax.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

using Catch::Matchers::StartsWith;
using pmt::ops::Mask;
using pmt::test::Host;

TEMPLATE_TEST_CASE("softmax and log_softmax equal the reference, with and without a causal mask", "[ops][softmax]",
                   float, double) {
  using T = TestType;
  Host exec;
  auto x = pmt::make_tensor<T, Host>("x", 3, 6, 6), y = pmt::make_tensor<T, Host>("y", 3, 6, 6);
  auto ly = pmt::make_tensor<T, Host>("ly", 3, 6, 6);
  pmt::test::fill_random(x, 1, -3, 3);
  for (Mask mask : {Mask::None, Mask::Causal}) {
    pmt::ops::softmax(exec, x, y, mask);
    pmt::ops::log_softmax(exec, x, ly, mask);
    exec.fence();
    for (int b = 0; b < 3; ++b)
      for (int i = 0; i < 6; ++i) {
        const int n = mask == Mask::Causal ? i + 1 : 6;
        double mx = -1e300, s = 0;
        for (int j = 0; j < n; ++j) mx = std::max(mx, double(x(b, i, j)));
        for (int j = 0; j < n; ++j) s += std::exp(x(b, i, j) - mx);
        for (int j = 0; j < 6; ++j) {
          const double ref = j < n ? std::exp(x(b, i, j) - mx) / s : 0.0;
          CHECK(std::abs(y(b, i, j) - ref) <= 8 * pmt::test::tol<T>(6));
          if (j < n)
            CHECK(std::abs(ly(b, i, j) - std::log(ref)) <=
                  8 * pmt::test::tol<T>(6) * std::max(1.0, std::abs(std::log(ref))));
          else
            CHECK(std::isinf(ly(b, i, j)));
        }
      }
  }
  auto bad = pmt::make_tensor<T, Host>("bad", 3, 6, 5);
  CHECK_THROWS_WITH(pmt::ops::softmax(exec, x, bad),
                    StartsWith("pmt::ops::softmax: x is (3, 6, 6) but y is (3, 6, 5); expected equal shapes"));
  auto tall = pmt::make_tensor<T, Host>("tall", 7, 5);
  CHECK_THROWS_WITH(pmt::ops::softmax(exec, tall, tall, Mask::Causal),
                    StartsWith("pmt::ops::softmax: x is (7, 5); a causal mask needs rows <= cols"));
  CHECK_THROWS_WITH(pmt::ops::softmax_backward(exec, tall, tall, tall, Mask::Causal),
                    StartsWith("pmt::ops::softmax_backward: y is (7, 5); a causal mask needs rows <= cols"));
}

TEMPLATE_TEST_CASE("softmax and log_softmax on long rows (vector body, tails, causal) equal the reference",
                   "[ops][softmax]", float, double) {
  // Row lengths 77 (causal: 41 ... 77 visible) cover the 16-wide vector loop, its tail and the
  // prefetch of the next row; the wide value range reaches exp's underflow below -87.
  using T = TestType;
  Host exec;
  const int B = 2, R = 37, C = 77;
  auto x = pmt::make_tensor<T, Host>("x", B, R, C), y = pmt::make_tensor<T, Host>("y", B, R, C);
  auto ly = pmt::make_tensor<T, Host>("ly", B, R, C);
  pmt::test::fill_random(x, 7, -60, 60);
  for (Mask mask : {Mask::None, Mask::Causal}) {
    pmt::ops::softmax(exec, x, y, mask);
    pmt::ops::log_softmax(exec, x, ly, mask);
    exec.fence();
    double worst = 0, worst_log = 0;
    for (int b = 0; b < B; ++b)
      for (int i = 0; i < R; ++i) {
        const int n = mask == Mask::Causal ? i + 1 + (C - R) : C;
        double mx = -1e300, s = 0;
        for (int j = 0; j < n; ++j) mx = std::max(mx, double(x(b, i, j)));
        for (int j = 0; j < n; ++j) s += std::exp(double(x(b, i, j)) - mx);
        for (int j = 0; j < C; ++j) {
          const double ref = j < n ? std::exp(double(x(b, i, j)) - mx) / s : 0.0;
          worst            = std::max(worst, std::abs(double(y(b, i, j)) - ref));
          if (j < n)
            worst_log =
                std::max(worst_log, std::abs(ly(b, i, j) - std::log(ref)) / std::max(1.0, std::abs(std::log(ref))));
          else
            CHECK(std::isinf(ly(b, i, j)));
        }
      }
    CHECK(worst <= 8 * pmt::test::tol<T>(C));
    CHECK(worst_log <= 8 * pmt::test::tol<T>(C));
  }
}

TEMPLATE_TEST_CASE("softmax is bitwise the same on Serial, on OpenMP and as its row building blocks",
                   "[ops][softmax][determinism]", float, double) {
#if defined(KOKKOS_ENABLE_SERIAL) && defined(KOKKOS_ENABLE_OPENMP)
  using T = TestType;
  // A row's result may depend neither on the thread count nor on where it falls in a chunk of
  // rows (the AVX2 float kernel pipelines rows in chunks sized by the thread count): each row
  // must be lane_max, exp_sum_row and the scaling, bit for bit. Causal rows of 41 ... 77
  // visible columns change length across the 16-wide bodies within a chunk.
  const int B = 3, R = 37, C = 77;
  auto x  = pmt::make_tensor<T, Host>("x", B, R, C);
  auto ys = pmt::make_tensor<T, Host>("ys", B, R, C), yo = pmt::make_tensor<T, Host>("yo", B, R, C);
  pmt::test::fill_random(x, 17, -30, 30);
  std::vector<T> e(C);
  for (Mask mask : {Mask::None, Mask::Causal}) {
    pmt::ops::softmax(Kokkos::Serial(), x, ys, mask);
    pmt::ops::softmax(Kokkos::OpenMP(), x, yo, mask);
    Kokkos::OpenMP().fence();
    bool same = true;
    for (int b = 0; b < B; ++b)
      for (int i = 0; i < R; ++i) {
        const int n  = mask == Mask::Causal ? i + 1 + (C - R) : C;
        const T* row = &x(b, i, 0);
        const T mx   = pmt::detail::lane_max(row, n);
        const T inv  = T(1) / pmt::detail::exp_sum_row(row, n, mx, e.data(), static_cast<const T*>(nullptr),
                                                       static_cast<T*>(nullptr));
        for (int j = 0; j < C; ++j)
          same = same && ys(b, i, j) == yo(b, i, j) && yo(b, i, j) == (j < n ? e[j] * inv : T(0));
      }
    INFO("mask " << (mask == Mask::Causal ? "causal" : "none")
                 << ", OpenMP threads: " << Kokkos::OpenMP().concurrency());
    CHECK(same);
  }
#else
  SKIP("needs both Kokkos::Serial and Kokkos::OpenMP");
#endif
}

TEST_CASE("the row exponential sums exp(x - max) to float accuracy, underflows to 0 below -87, keeps NaN",
          "[ops][softmax]") {
  // pmt::detail::exp_sum_row is the AVX2 kernel where the build targets AVX2 + FMA (pmt's own
  // tests do, with -march=native on such a CPU) and the portable loop elsewhere.
  const int n = 4099;
  std::vector<float> x(n), e(n);
  for (int j = 0; j < n; ++j) x[j] = -100.0f * float(j) / float(n - 1);  // 0 ... -100
  const float s  = pmt::detail::exp_sum_row(x.data(), n, 0.0f, e.data(), x.data(), e.data());
  double ref_sum = 0, worst = 0;
  for (int j = 0; j < n; ++j) {
    const double ref = std::exp(double(x[j]));
    ref_sum += ref;
    if (x[j] >= -87.0f)
      worst = std::max(worst, std::abs(e[j] - ref) / ref);
    else
      CHECK(e[j] == 0.0f);
  }
  CHECK(worst <= 3e-7);
  CHECK(std::abs(s - ref_sum) <= 1e-6 * ref_sum);
  INFO("host back end: " << pmt::detail::host::Native::name);
  std::vector<float> z(32, -1.0f), ez(32);
  z[5]           = std::nanf("");
  z[20]          = -std::numeric_limits<float>::infinity();
  const float sz = pmt::detail::exp_sum_row(z.data(), 32, 0.0f, ez.data(), static_cast<const float*>(nullptr),
                                            static_cast<float*>(nullptr));
  CHECK(std::isnan(ez[5]));
  CHECK(std::isnan(sz));
  CHECK(ez[20] == 0.0f);
  CHECK(std::abs(ez[0] - std::exp(-1.0)) <= 3e-7 * std::exp(-1.0));
}

TEST_CASE("the scalar exponentials: float accuracy, 0 below -87, NaN kept, no undefined conversion", "[ops][softmax]") {
  // exp_nonpositive (softmax, cross-entropy, the rows' scalar tails) and exp_fast (GELU's portable
  // path). A NaN passes their clamps; converting it to an integer for 2^k would be undefined
  // behaviour (scripts/check.sh runs this under UBSan), so the exponent is bounded first.
  using pmt::detail::exp_fast;
  using pmt::detail::exp_nonpositive;
  double worst_np = 0, worst_fast = 0;
  for (int j = 0; j <= 2000; ++j) {
    const float x    = -87.0f * float(j) / 2000.0f;
    const double ref = std::exp(double(x));
    worst_np         = std::max(worst_np, std::abs(exp_nonpositive(x) - ref) / ref);
    const float xp   = 88.0f * float(j) / 2000.0f;  // exp_fast covers positive arguments too
    worst_fast       = std::max({worst_fast, std::abs(exp_fast(x) - ref) / ref,
                                 std::abs(exp_fast(xp) - std::exp(double(xp))) / std::exp(double(xp))});
  }
  CHECK(worst_np <= 3e-7);
  CHECK(worst_fast <= 3e-7);
  const float inf = std::numeric_limits<float>::infinity(), nan = std::nanf("");
  for (float below : {-87.5f, -1000.0f, -inf}) {
    CHECK(exp_nonpositive(below) == 0.0f);
    CHECK(exp_fast(below) == 0.0f);
  }
  CHECK(std::isnan(exp_nonpositive(nan)));
  CHECK(std::isnan(exp_fast(nan)));
  CHECK(std::isnan(exp_nonpositive(-nan)));
  CHECK(exp_fast(inf) == exp_fast(88.0f));  // clamped to the largest argument it handles
  CHECK(exp_nonpositive(-0.0f) == 1.0f);
  CHECK(exp_nonpositive(double(-2)) == std::exp(-2.0));  // double: the library exp
}

TEMPLATE_TEST_CASE("the row maximum equals std::max over every length, skips NaN in x, is -inf when empty",
                   "[ops][softmax]", float, double) {
  // pmt::detail::lane_max is vectorised with maxps/maxpd where the build targets AVX2 and is the
  // portable loop elsewhere; both keep `x > acc ? x : acc` per lane.
  using T = TestType;
  std::vector<T> x(100);
  for (std::size_t j = 0; j < x.size(); ++j) x[j] = T(-50) + T((j * 37) % 101);
  for (int n : {0, 1, 7, 15, 16, 17, 31, 32, 33, 64, 100}) {
    for (int at = 0; at < n; at += 5) {  // the maximum at every fifth position in turn
      std::vector<T> r(x.begin(), x.begin() + n);
      r[at] = T(1000) + T(at);
      CHECK(pmt::detail::lane_max(r.data(), n) == r[at]);
    }
    if (n == 0) CHECK(pmt::detail::lane_max(x.data(), 0) == -std::numeric_limits<T>::infinity());
  }
  std::vector<T> z(40, T(-3));
  z[2]  = std::numeric_limits<T>::quiet_NaN();
  z[18] = std::numeric_limits<T>::quiet_NaN();
  z[33] = T(2);
  CHECK(pmt::detail::lane_max(z.data(), 40) == T(2));
  std::vector<T> neg(20, -std::numeric_limits<T>::infinity());
  CHECK(pmt::detail::lane_max(neg.data(), 20) == -std::numeric_limits<T>::infinity());
}

TEMPLATE_TEST_CASE("the row sum is lane_sum's result bit for bit, on every length", "[ops][layernorm]", float, double) {
  // pmt::detail::row_sum keeps the float lanes in two AVX2 registers where the build targets AVX2
  // and is lane_sum elsewhere; either way the same 16 lanes, summed and combined in the same order.
  using T = TestType;
  std::vector<T> x(100);
  for (std::size_t j = 0; j < x.size(); ++j) x[j] = T(0.1) * T((j * 37) % 101) - T(3.3) + T(1e-3) * T(j);
  for (int n = 0; n <= 100; ++n) {
    INFO("n = " << n << ", host back end: " << pmt::detail::host::Native::name);
    const T expect = pmt::detail::lane_sum<T>(
        x.data(), n, KOKKOS_LAMBDA(T e) { return e; });
    CHECK(pmt::detail::row_sum<T>(x.data(), n) == expect);
  }
}

TEST_CASE("softmax_backward and log_softmax_backward match finite differences", "[ops][softmax][gradient]") {
  Host exec;
  auto x = pmt::make_tensor<double, Host>("x", 2, 5, 5), y = pmt::make_tensor<double, Host>("y", 2, 5, 5);
  auto w = pmt::make_tensor<double, Host>("w", 2, 5, 5), dx = pmt::make_tensor<double, Host>("dx", 2, 5, 5);
  pmt::test::fill_random(x, 2, -2, 2);
  pmt::test::fill_random(w, 3);
  for (Mask mask : {Mask::None, Mask::Causal}) {
    auto sm_loss = [&] {
      pmt::ops::softmax(exec, x, y, mask);
      exec.fence();
      return pmt::test::weighted_sum(w, y);
    };
    sm_loss();
    pmt::ops::softmax_backward(exec, y, w, dx, mask);
    exec.fence();
    CHECK(pmt::test::finite_difference_error(x, dx, sm_loss) <= 1e-6);
    // log-softmax: masked outputs are -inf, so weight only the visible ones
    auto wl = pmt::make_tensor<double, Host>("wl", 2, 5, 5);
    Kokkos::deep_copy(wl, w);
    if (mask == Mask::Causal)
      for (int b = 0; b < 2; ++b)
        for (int i = 0; i < 5; ++i)
          for (int j = i + 1; j < 5; ++j) wl(b, i, j) = 0;
    auto lsm_loss = [&] {
      pmt::ops::log_softmax(exec, x, y, mask);
      exec.fence();
      double s = 0;
      for (std::size_t i = 0; i < y.size(); ++i)
        if (wl.data()[i] != 0) s += wl.data()[i] * y.data()[i];
      return s;
    };
    lsm_loss();
    pmt::ops::log_softmax_backward(exec, y, wl, dx, mask);
    exec.fence();
    CHECK(pmt::test::finite_difference_error(x, dx, lsm_loss) <= 1e-6);
  }
}

namespace {

/// layernorm_forward on random (N, C) data: x of type T, statistics of type S.
template <class T, class S>
struct LayernormCase {
  pmt::Tensor<T, 2, Host> x, y;
  pmt::Tensor<T, 1, Host> w, b;
  pmt::Tensor<S, 1, Host> mean, rstd;
  LayernormCase(int N, int C, std::uint32_t seed)
      : x(pmt::make_tensor<T, Host>("x", N, C)),
        y(pmt::make_tensor<T, Host>("y", N, C)),
        w(pmt::make_tensor<T, Host>("w", C)),
        b(pmt::make_tensor<T, Host>("b", C)),
        mean(pmt::make_tensor<S, Host>("mean", N)),
        rstd(pmt::make_tensor<S, Host>("rstd", N)) {
    pmt::test::fill_random(x, seed, -2, 5);
    pmt::test::fill_random(w, seed + 1);
    pmt::test::fill_random(b, seed + 2);
    Host exec;
    pmt::ops::layernorm_forward(exec, x, w, b, y, mean, rstd, 1e-5);
    exec.fence();
  }
  /// Row n's mean and 1 / sqrt(variance + 1e-5), in double.
  std::pair<double, double> reference(int n) const {
    const auto C = static_cast<int>(x.extent(1));
    double m = 0, v = 0;
    for (int c = 0; c < C; ++c) m += x(n, c);
    m /= C;
    for (int c = 0; c < C; ++c) v += (x(n, c) - m) * (x(n, c) - m);
    return {m, 1 / std::sqrt(v / C + 1e-5)};
  }
};

}  // namespace

TEMPLATE_TEST_CASE("layernorm forward equals the reference and saves mean and rstd", "[ops][layernorm]", float,
                   double) {
  using T     = TestType;
  const int N = 9, C = 33;
  LayernormCase<T, double> lc(N, C, 4);
  for (int n = 0; n < N; ++n) {
    const auto [m, rs] = lc.reference(n);
    CHECK(std::abs(lc.mean(n) - m) <= 1e-12 * std::max(1.0, std::abs(m)) + 4 * pmt::test::tol<T>(C));
    CHECK(std::abs(lc.rstd(n) - rs) <= 1e-6 * rs);
    for (int c = 0; c < C; ++c)
      CHECK(std::abs(lc.y(n, c) - ((lc.x(n, c) - m) * rs * lc.w(c) + lc.b(c))) <= 32 * pmt::test::tol<T>(C));
  }
  Host exec;
  auto wrong = pmt::make_tensor<T, Host>("wrong", C + 1);
  CHECK_THROWS_WITH(pmt::ops::layernorm_forward(exec, lc.x, wrong, wrong, lc.y, lc.mean, lc.rstd),
                    StartsWith("pmt::ops::layernorm_forward: x is (9, 33) but weight is (34) and bias is (34)"));
}

TEST_CASE("layernorm forward with fp32 statistics equals the reference (vector body and tail)", "[ops][layernorm]") {
  // float x, y and statistics take the AVX2 kernel where the build targets AVX2: rows pipelined in
  // chunks (row n's mean pass stores row n - 1). 203 rows make chunks of several rows and a
  // partial last one; the widths cover C < 8, vector bodies and both tails (8 and 1 wide).
  for (int C : {1, 7, 8, 16, 24, 33, 64, 100}) {
    const int N = 203;
    LayernormCase<float, float> lc(N, C, 14);
    INFO("C = " << C << ", host back end: " << pmt::detail::host::Native::name);
    for (int n = 0; n < N; ++n) {
      const auto [m, rs] = lc.reference(n);
      CHECK(std::abs(lc.mean(n) - m) <= 1e-5 * std::max(1.0, std::abs(m)));
      CHECK(std::abs(lc.rstd(n) - rs) <= 1e-5 * rs);
      for (int c = 0; c < C; ++c)
        CHECK(std::abs(lc.y(n, c) - ((lc.x(n, c) - m) * rs * lc.w(c) + lc.b(c))) <=
              1e-5 * (1 + std::abs(lc.b(c)) + std::abs(lc.w(c)) * 4));
    }
  }
}

TEMPLATE_TEST_CASE("layernorm forward is bitwise the same on Serial, on OpenMP and row by row",
                   "[ops][layernorm][determinism]", float, double) {
#if defined(KOKKOS_ENABLE_SERIAL) && defined(KOKKOS_ENABLE_OPENMP)
  using T = TestType;
  // Rows are independent: a row's result may depend neither on the thread count nor on where it
  // falls in a chunk of rows (the AVX2 kernel pipelines rows in chunks sized by the thread count).
  for (int C : {7, 40, 100}) {
    const int N = 157;
    LayernormCase<T, T> lc(N, C, 21);
    auto y1 = pmt::make_tensor<T, Host>("y1", N, C);
    auto m1 = pmt::make_tensor<T, Host>("m1", N), r1 = pmt::make_tensor<T, Host>("r1", N);
    pmt::ops::layernorm_forward(Kokkos::Serial(), lc.x, lc.w, lc.b, y1, m1, r1, 1e-5);
    bool same = true;
    for (int n = 0; n < N; ++n) {
      auto rows  = std::make_pair(n, n + 1);
      auto y_row = pmt::make_tensor<T, Host>("y_row", 1, C);
      auto m_row = pmt::make_tensor<T, Host>("m_row", 1), r_row = pmt::make_tensor<T, Host>("r_row", 1);
      pmt::ops::layernorm_forward(Kokkos::OpenMP(), Kokkos::subview(lc.x, rows, Kokkos::ALL), lc.w, lc.b, y_row, m_row,
                                  r_row, 1e-5);
      Kokkos::OpenMP().fence();
      same = same && m1(n) == lc.mean(n) && r1(n) == lc.rstd(n) && m_row(0) == lc.mean(n) && r_row(0) == lc.rstd(n);
      for (int c = 0; c < C; ++c) same = same && y1(n, c) == lc.y(n, c) && y_row(0, c) == lc.y(n, c);
    }
    INFO("C = " << C << ", OpenMP threads: " << Kokkos::OpenMP().concurrency());
    CHECK(same);
  }
#else
  SKIP("needs both Kokkos::Serial and Kokkos::OpenMP");
#endif
}

TEST_CASE("layernorm_backward matches finite differences for x, weight and bias", "[ops][layernorm][gradient]") {
  Host exec;
  const int N = 6, C = 10;
  auto x = pmt::make_tensor<double, Host>("x", N, C), y = pmt::make_tensor<double, Host>("y", N, C);
  auto w = pmt::make_tensor<double, Host>("w", C), b = pmt::make_tensor<double, Host>("b", C);
  auto dy = pmt::make_tensor<double, Host>("dy", N, C), dx = pmt::make_tensor<double, Host>("dx", N, C);
  auto dw = pmt::make_tensor<double, Host>("dw", C), db = pmt::make_tensor<double, Host>("db", C);
  auto mean = pmt::make_tensor<double, Host>("mean", N), rstd = pmt::make_tensor<double, Host>("rstd", N);
  pmt::test::fill_random(x, 7, -2, 2);
  pmt::test::fill_random(w, 8);
  pmt::test::fill_random(b, 9);
  pmt::test::fill_random(dy, 10);
  auto loss = [&] {
    pmt::ops::layernorm_forward(exec, x, w, b, y, mean, rstd, 1e-5);
    exec.fence();
    return pmt::test::weighted_sum(dy, y);
  };
  loss();
  pmt::ops::layernorm_backward(exec, dy, x, w, mean, rstd, dx, dw, db);
  exec.fence();
  CHECK(pmt::test::finite_difference_error(x, dx, loss) <= 1e-6);
  CHECK(pmt::test::finite_difference_error(w, dw, loss) <= 1e-6);
  CHECK(pmt::test::finite_difference_error(b, db, loss) <= 1e-6);
}

TEMPLATE_TEST_CASE("softmax_cross_entropy equals the reference, honours ignore_index and the normaliser",
                   "[ops][cross_entropy]", float, double) {
  using T = TestType;
  Host exec;
  const int N = 12, V = 17;
  auto logits = pmt::make_tensor<T, Host>("logits", N, V), dl = pmt::make_tensor<T, Host>("dl", N, V);
  Kokkos::View<int*, Kokkos::LayoutRight, Kokkos::HostSpace> t("t", N);
  pmt::test::fill_random(logits, 11, -4, 4);
  for (int n = 0; n < N; ++n) t(n) = n % 4 == 3 ? -100 : (n * 7) % V;
  Kokkos::View<double, Kokkos::HostSpace> loss("loss");
  const double normaliser = 40;  // e.g. the global token count
  pmt::ops::softmax_cross_entropy(exec, logits, t, normaliser, loss, dl);
  exec.fence();
  double ref = 0;
  for (int n = 0; n < N; ++n) {
    if (t(n) == -100) {
      for (int v = 0; v < V; ++v) CHECK(dl(n, v) == T(0));
      continue;
    }
    double mx = -1e300, s = 0;
    for (int v = 0; v < V; ++v) mx = std::max(mx, double(logits(n, v)));
    for (int v = 0; v < V; ++v) s += std::exp(logits(n, v) - mx);
    ref += mx + std::log(s) - logits(n, t(n));
    for (int v = 0; v < V; ++v)
      CHECK(std::abs(dl(n, v) - (std::exp(logits(n, v) - mx) / s - (v == t(n))) / normaliser) <=
            8 * pmt::test::tol<T>(V));
  }
  CHECK(std::abs(loss() - ref / normaliser) <= 8 * pmt::test::tol<T>(N * V) * std::max(1.0, ref / normaliser));
  t(0) = V;
  CHECK_THROWS_WITH(pmt::ops::softmax_cross_entropy(exec, logits, t, normaliser, loss, dl),
                    StartsWith("pmt::ops::softmax_cross_entropy: 1 of 12 targets lie outside [0, 17)"));
  t(0) = 0;
  CHECK_THROWS_AS(pmt::ops::cross_entropy(exec, logits, t, 0.0, loss), pmt::ConfigError);
}

TEST_CASE("softmax_cross_entropy's gradient matches finite differences, also in place",
          "[ops][cross_entropy][gradient]") {
  Host exec;
  const int N = 5, V = 7;
  auto logits = pmt::make_tensor<double, Host>("logits", N, V), dl = pmt::make_tensor<double, Host>("dl", N, V);
  Kokkos::View<long*, Kokkos::LayoutRight, Kokkos::HostSpace> t("t", N);
  pmt::test::fill_random(logits, 12, -3, 3);
  for (int n = 0; n < N; ++n) t(n) = n == 2 ? -1 : (3 * n + 1) % V;
  Kokkos::View<double, Kokkos::HostSpace> loss("loss");
  pmt::ops::softmax_cross_entropy(exec, logits, t, 3.0, loss, dl, -1);
  exec.fence();
  auto f = [&] {
    pmt::ops::cross_entropy(exec, logits, t, 3.0, loss, -1);
    exec.fence();
    return loss();
  };
  CHECK(pmt::test::finite_difference_error(logits, dl, f) <= 1e-6);
  const double l0 = f();
  pmt::ops::softmax_cross_entropy(exec, logits, t, 3.0, loss, logits, -1);  // in place
  exec.fence();
  CHECK(loss() == l0);
  CHECK(pmt::test::bitwise_equal(logits, dl));
}

namespace {
// While alive, the row-wise ops take their device-shaped team path on the host too.
struct ForceTeams {
  ForceTeams() { pmt::detail::rowwise_force_teams() = true; }
  ~ForceTeams() { pmt::detail::rowwise_force_teams() = false; }
};
}  // namespace

TEMPLATE_TEST_CASE("the device-shaped team path of softmax, layernorm and cross-entropy equals the host path",
                   "[ops][softmax][layernorm][cross_entropy][teams]", float, double) {
  using T = TestType;
  Host exec;
  const double tol = 16 * pmt::test::tol<T>(300);
  // softmax and log-softmax, forward and backward, with and without the causal mask (tails,
  // rows with one visible column, and a batch dimension); y aliasing x in place as well
  for (const Mask mask : {Mask::None, Mask::Causal}) {
    INFO("causal " << (mask == Mask::Causal));
    auto x = pmt::make_tensor<T, Host>("x", 3, 37, 45), dy = pmt::make_tensor<T, Host>("dy", 3, 37, 45);
    pmt::test::fill_random(x, 31, -20, 20);
    pmt::test::fill_random(dy, 32);
    std::vector<decltype(x)> out;
    for (const bool teams : {false, true}) {
      std::optional<ForceTeams> force;
      if (teams) force.emplace();
      auto y = pmt::make_tensor<T, Host>("y", 3, 37, 45), ly = pmt::make_tensor<T, Host>("ly", 3, 37, 45);
      auto dx = pmt::make_tensor<T, Host>("dx", 3, 37, 45), ldx = pmt::make_tensor<T, Host>("ldx", 3, 37, 45);
      auto inplace = pmt::make_tensor<T, Host>("inplace", 3, 37, 45);
      Kokkos::deep_copy(inplace, x);
      pmt::ops::softmax(exec, x, y, mask);
      pmt::ops::softmax(exec, inplace, inplace, mask);
      pmt::ops::log_softmax(exec, x, ly, mask);
      pmt::ops::softmax_backward(exec, y, dy, dx, mask);
      pmt::ops::log_softmax_backward(exec, ly, dy, ldx, mask);
      exec.fence();
      CHECK(pmt::test::bitwise_equal(inplace, y));
      for (auto v : {y, ly, dx, ldx}) out.push_back(v);
    }
    for (int k = 0; k < 4; ++k) {
      INFO("output " << k);
      // -inf of masked log-softmax entries: equal on both paths, compared as such
      auto a = pmt::detail::flat(out[k]), b = pmt::detail::flat(out[4 + k]);
      double worst = 0;
      for (std::size_t i = 0; i < a.extent(0); ++i) {
        if (std::isinf(a(i)) || std::isinf(b(i))) {
          CHECK(a(i) == b(i));
          continue;
        }
        worst = std::max(worst, std::abs(double(a(i)) - double(b(i))) / std::max(1.0, std::abs(double(b(i)))));
      }
      CHECK(worst <= tol);
    }
  }
  // layernorm forward and backward (C not a multiple of the lanes)
  {
    const int N = 29, C = 71;
    auto x = pmt::make_tensor<T, Host>("x", N, C), dy = pmt::make_tensor<T, Host>("dy", N, C);
    auto w = pmt::make_tensor<T, Host>("w", C), b = pmt::make_tensor<T, Host>("b", C);
    pmt::test::fill_random(x, 41, -2, 5);
    pmt::test::fill_random(dy, 42);
    pmt::test::fill_random(w, 43);
    pmt::test::fill_random(b, 44);
    std::vector<Kokkos::View<T**, Kokkos::LayoutRight, Host::memory_space>> ys, dxs;
    std::vector<Kokkos::View<T*, Kokkos::LayoutRight, Host::memory_space>> stats;
    for (const bool teams : {false, true}) {
      std::optional<ForceTeams> force;
      if (teams) force.emplace();
      auto y = pmt::make_tensor<T, Host>("y", N, C), dx = pmt::make_tensor<T, Host>("dx", N, C);
      auto mean = pmt::make_tensor<T, Host>("mean", N), rstd = pmt::make_tensor<T, Host>("rstd", N);
      auto dw = pmt::make_tensor<T, Host>("dw", C), db = pmt::make_tensor<T, Host>("db", C);
      pmt::ops::layernorm_forward(exec, x, w, b, y, mean, rstd, 1e-5);
      pmt::ops::layernorm_backward(exec, dy, x, w, mean, rstd, dx, dw, db);
      exec.fence();
      ys.push_back(y), dxs.push_back(dx), stats.push_back(mean), stats.push_back(rstd), stats.push_back(dw),
          stats.push_back(db);
    }
    CHECK(pmt::test::max_rel_diff(ys[1], ys[0]) <= tol);
    CHECK(pmt::test::max_rel_diff(dxs[1], dxs[0]) <= tol);
    for (int k = 0; k < 4; ++k) CHECK(pmt::test::max_rel_diff(stats[4 + k], stats[k]) <= tol);
  }
  // fused softmax + cross-entropy, with an ignored row, and in place (dlogits aliasing logits)
  {
    const int N = 23, V = 67;
    auto logits = pmt::make_tensor<T, Host>("logits", N, V);
    pmt::test::fill_random(logits, 51, -8, 8);
    Kokkos::View<int*, Kokkos::HostSpace> targets("targets", N);
    for (int n = 0; n < N; ++n) targets(n) = n == 5 ? -100 : (n * 7 + 3) % V;
    std::vector<double> losses;
    std::vector<decltype(logits)> grads;
    for (const bool teams : {false, true}) {
      std::optional<ForceTeams> force;
      if (teams) force.emplace();
      Kokkos::View<double, Kokkos::HostSpace> loss("loss");
      auto d = pmt::make_tensor<T, Host>("d", N, V);
      Kokkos::deep_copy(d, logits);
      pmt::ops::softmax_cross_entropy(exec, d, targets, double(N - 1), loss, d);  // in place
      exec.fence();
      losses.push_back(loss());
      grads.push_back(d);
    }
    CHECK(std::abs(losses[1] - losses[0]) <= tol * std::abs(losses[0]));
    CHECK(pmt::test::max_rel_diff(grads[1], grads[0]) <= tol);
    for (int v = 0; v < V; ++v) CHECK(grads[1](5, v) == T(0));
  }
}

#if PMT_HOST_AVX512
// The AVX-512 back end must give the AVX2 back end's bits: the same operations per element, the
// same 16 lanes per row (one register instead of two).
TEST_CASE("the AVX-512 host back end gives the AVX2 back end's bits", "[ops][rowwise][simd]") {
  using A         = pmt::detail::host::Avx2;
  using B         = pmt::detail::host::Avx512;
  constexpr int n = 16 * 61 + 11;  // whole blocks and a tail
  std::vector<float> x(n), dy(n);
  std::uint32_t s = 12345;
  const auto next = [&s] {
    s = s * 1664525u + 1013904223u;
    return static_cast<float>(s >> 8) / 16777216.0f;
  };
  for (int i = 0; i < n; ++i)
    x[static_cast<std::size_t>(i)] = -100.0f + 120.0f * next(), dy[static_cast<std::size_t>(i)] = next() - 0.5f;
  x[3] = std::nanf(""), x[40] = -std::numeric_limits<float>::infinity(), x[77] = -87.0f, x[78] = 0.0f;
  const auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
    return std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };
  std::vector<float> acc_a(16), acc_b(16);
  CHECK(A::lanes_sum(x.data() + 4, n - 4, acc_a.data()) == B::lanes_sum(x.data() + 4, n - 4, acc_b.data()));
  CHECK(same(acc_a, acc_b));
  CHECK(A::lanes_max(x.data(), n, acc_a.data()) == B::lanes_max(x.data(), n, acc_b.data()));
  CHECK(same(acc_a, acc_b));
  std::vector<float> ya(n), yb(n), xs(x.begin() + 5, x.end());  // x <= max: exp(x - 21) over the rest
  xs.resize(static_cast<std::size_t>(n));
  xs[10] = 21.0f - 87.0f, xs[11] = std::nanf(""), xs[12] = 21.0f;  // x - max at the bounds: -87, NaN, 0
  CHECK(A::lanes_exp_sum(xs.data(), n - 5, 21.0f, ya.data(), nullptr, nullptr, acc_a.data()) ==
        B::lanes_exp_sum(xs.data(), n - 5, 21.0f, yb.data(), nullptr, nullptr, acc_b.data()));
  CHECK(same(acc_a, acc_b));
  CHECK(same(ya, yb));
  const auto c = pmt::detail::gelu_constants<A>();
  std::fill(ya.begin(), ya.end(), 0.0f), std::fill(yb.begin(), yb.end(), 0.0f);
  for (std::size_t i = 0; i + 16 <= static_cast<std::size_t>(n); i += 16) {
    A::gelu(x.data(), ya.data(), i, c), A::gelu(x.data(), ya.data(), i + 8, c);
    B::gelu(x.data(), yb.data(), i, c);
  }
  CHECK(same(ya, yb));
  for (std::size_t i = 0; i + 16 <= static_cast<std::size_t>(n); i += 16) {
    A::gelu_backward(x.data(), dy.data(), ya.data(), i, c), A::gelu_backward(x.data(), dy.data(), ya.data(), i + 8, c);
    B::gelu_backward(x.data(), dy.data(), yb.data(), i, c);
  }
  CHECK(same(ya, yb));
}
#endif
