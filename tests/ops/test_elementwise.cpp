// SPDX-License-Identifier: Apache-2.0
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include "ops_test.hpp"
#include "pmt/ops/argmax.hpp"
#include "pmt/ops/elementwise.hpp"
#include "pmt/ops/multi_tensor.hpp"
#include "pmt/ops/reduction.hpp"
#include "pmt/ops/update.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

using pmt::test::Host;

TEMPLATE_TEST_CASE("add, scale, axpy and bias_add equal the reference", "[ops][elementwise]", float, double) {
  using T = TestType;
  Host exec;
  auto a = pmt::make_tensor<T, Host>("a", 7, 5, 3), b = pmt::make_tensor<T, Host>("b", 7, 5, 3);
  auto out  = pmt::make_tensor<T, Host>("out", 7, 5, 3);
  auto bias = pmt::make_tensor<T, Host>("bias", 3);
  pmt::test::fill_random(a, 1);
  pmt::test::fill_random(b, 2);
  pmt::test::fill_random(bias, 3);
  pmt::ops::add(exec, a, b, out);
  exec.fence();
  CHECK(out(6, 4, 2) == a(6, 4, 2) + b(6, 4, 2));
  pmt::ops::scale(exec, out, T(2));
  pmt::ops::axpy(exec, T(-1), a, out);  // out = 2(a + b) - a = a + 2b
  pmt::ops::bias_add(exec, out, bias);
  exec.fence();
  for (int i = 0; i < 7; ++i)
    for (int j = 0; j < 5; ++j)
      for (int k = 0; k < 3; ++k)
        CHECK(std::abs(out(i, j, k) - (a(i, j, k) + 2 * b(i, j, k) + bias(k))) <= 4 * pmt::test::tol<T>());
  auto bad = pmt::make_tensor<T, Host>("bad", 4);
  CHECK_THROWS_WITH(pmt::ops::bias_add(exec, out, bad),
                    Catch::Matchers::StartsWith("pmt::ops::bias_add: y is (7, 5, 3) but bias is (4)"));
  CHECK_THROWS_AS(pmt::ops::add(exec, a, bad, out), pmt::ShapeError);
}

TEMPLATE_TEST_CASE("gelu and relu equal their formulas", "[ops][elementwise]", float, double) {
  using T = TestType;
  Host exec;
  auto x = pmt::make_tensor<T, Host>("x", 1000), y = pmt::make_tensor<T, Host>("y", 1000);
  pmt::test::fill_random(x, 4, -5, 5);
  pmt::ops::gelu(exec, x, y);
  exec.fence();
  for (int i = 0; i < 1000; ++i) {
    const double v   = x(i);
    const double ref = 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
    CHECK(std::abs(y(i) - ref) <= 8 * pmt::test::tol<T>() * std::max(1.0, std::abs(ref)));
  }
  // gelu_backward against the analytic derivative, over a range that reaches exp's clamps, with
  // dx aliasing dy (1000 elements: the 8-wide body and a scalar tail where the build has AVX2)
  auto dy = pmt::make_tensor<T, Host>("dy", 1000);
  pmt::test::fill_random(x, 8, -12, 12);
  pmt::test::fill_random(dy, 9);
  auto dy0 = pmt::make_tensor<T, Host>("dy0", 1000);
  Kokkos::deep_copy(dy0, dy);
  pmt::ops::gelu_backward(exec, x, dy, dy);
  pmt::ops::gelu(exec, x, y);
  exec.fence();
  for (int i = 0; i < 1000; ++i) {
    const double v = x(i), k = std::sqrt(2 / M_PI), t = std::tanh(k * (v + 0.044715 * v * v * v));
    const double d = 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * k * (1 + 3 * 0.044715 * v * v);
    CHECK(std::abs(dy(i) - dy0(i) * d) <= 8 * pmt::test::tol<T>() * std::max(1.0, std::abs(dy0(i) * d)));
    const double ref = 0.5 * v * (1 + t);
    CHECK(std::abs(y(i) - ref) <= 8 * pmt::test::tol<T>() * std::max(1.0, std::abs(ref)));
  }
  pmt::ops::relu(exec, x, y);
  exec.fence();
  for (int i = 0; i < 1000; ++i) CHECK(y(i) == (x(i) > 0 ? x(i) : T(0)));
}

TEST_CASE("gelu_backward and relu_backward match finite differences", "[ops][elementwise][gradient]") {
  Host exec;
  auto x = pmt::make_tensor<double, Host>("x", 200), y = pmt::make_tensor<double, Host>("y", 200);
  auto w = pmt::make_tensor<double, Host>("w", 200), dx = pmt::make_tensor<double, Host>("dx", 200);
  pmt::test::fill_random(x, 5, -4, 4);
  pmt::test::fill_random(w, 6);
  pmt::ops::gelu_backward(exec, x, w, dx);
  exec.fence();
  auto gelu_loss = [&] {
    pmt::ops::gelu(exec, x, y);
    exec.fence();
    return pmt::test::weighted_sum(w, y);
  };
  CHECK(pmt::test::finite_difference_error(x, dx, gelu_loss) <= 1e-6);
  for (int i = 0; i < 200; ++i)
    if (std::abs(x(i)) < 1e-3) x(i) = 0.5;  // keep away from the kink
  pmt::ops::relu_backward(exec, x, w, dx);
  exec.fence();
  auto relu_loss = [&] {
    pmt::ops::relu(exec, x, y);
    exec.fence();
    return pmt::test::weighted_sum(w, y);
  };
  CHECK(pmt::test::finite_difference_error(x, dx, relu_loss) <= 1e-6);
}

TEST_CASE("silu and tanh equal their formulas; their backward matches finite differences",
          "[ops][elementwise][gradient]") {
  Host exec;
  auto x = pmt::make_tensor<double, Host>("x", 200), y = pmt::make_tensor<double, Host>("y", 200);
  auto w = pmt::make_tensor<double, Host>("w", 200), dx = pmt::make_tensor<double, Host>("dx", 200);
  pmt::test::fill_random(x, 7, -6, 6);
  pmt::test::fill_random(w, 8);
  pmt::ops::silu(exec, x, y);
  exec.fence();
  double worst = 0;
  for (int i = 0; i < 200; ++i) worst = std::max(worst, std::abs(y(i) - x(i) / (1 + std::exp(-x(i)))));
  pmt::ops::tanh(exec, x, y);
  exec.fence();
  for (int i = 0; i < 200; ++i) worst = std::max(worst, std::abs(y(i) - std::tanh(x(i))));
  CHECK(worst <= 1e-15);
  pmt::ops::silu_backward(exec, x, w, dx);
  exec.fence();
  auto silu_loss = [&] {
    pmt::ops::silu(exec, x, y);
    exec.fence();
    return pmt::test::weighted_sum(w, y);
  };
  CHECK(pmt::test::finite_difference_error(x, dx, silu_loss) <= 1e-6);
  pmt::ops::tanh(exec, x, y);
  pmt::ops::tanh_backward(exec, y, w, dx);  // from the output
  exec.fence();
  auto tanh_loss = [&] {
    pmt::ops::tanh(exec, x, y);
    exec.fence();
    return pmt::test::weighted_sum(w, y);
  };
  CHECK(pmt::test::finite_difference_error(x, dx, tanh_loss) <= 1e-6);
}

TEST_CASE("argmax_rows takes the first largest entry; accuracy counts hits and skips ignored rows", "[ops][argmax]") {
  Host exec;
  Kokkos::View<double**, Kokkos::LayoutRight, Kokkos::HostSpace> x("x", 4, 3);
  const double rows[4][3] = {{0.1, 0.7, 0.2}, {2.0, 2.0, -1.0}, {-3.0, -1.0, -2.0}, {0.0, std::nan(""), 5.0}};
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 3; ++j) x(i, j) = rows[i][j];
  Kokkos::View<std::int32_t*, Kokkos::HostSpace> ids("ids", 4), targets("t", 4);
  pmt::ops::argmax_rows(exec, x, ids);
  exec.fence();
  CHECK(ids(0) == 1);
  CHECK(ids(1) == 0);  // a tie: the first
  CHECK(ids(2) == 1);
  CHECK(ids(3) == 1);  // a nan wins: a broken row is never right by chance
  targets(0) = 1, targets(1) = 2, targets(2) = -100, targets(3) = 2;
  const auto [correct, counted] = pmt::ops::accuracy(exec, x, targets);
  CHECK(correct == 1);
  CHECK(counted == 3);
  Kokkos::View<std::int32_t*, Kokkos::HostSpace> short_ids("ids", 3);
  CHECK_THROWS_WITH(pmt::ops::argmax_rows(exec, x, short_ids),
                    Catch::Matchers::ContainsSubstring("pmt::ops::argmax_rows: x is (4, 3) and ids (3)"));
}

TEMPLATE_TEST_CASE("reductions equal the reference and are independent of the thread count",
                   "[ops][reduction][determinism]", float, double) {
  using T = TestType;
  Host exec;
  for (std::size_t n : {std::size_t(1), std::size_t(4097), std::size_t(100003)}) {
    auto x = pmt::make_tensor<T, Host>("x", n);
    pmt::test::fill_random(x, 7, -2, 3);
    long double s = 0, s2 = 0, mx = -1e300;
    for (std::size_t i = 0; i < n; ++i) {
      s += x(i);
      s2 += static_cast<long double>(x(i)) * x(i);
      mx = std::max<long double>(mx, x(i));
    }
    Kokkos::View<double, Kokkos::HostSpace> out("out");
    pmt::ops::sum(exec, x, out);
    exec.fence();
    CHECK(std::abs(out() - static_cast<double>(s)) <=
          1e-12 * std::max(1.0, std::abs(static_cast<double>(s))) * std::sqrt(n));
    pmt::ops::mean(exec, x, out);
    exec.fence();
    CHECK(std::abs(out() - static_cast<double>(s / n)) <= 1e-12);
    pmt::ops::max(exec, x, out);
    exec.fence();
    CHECK(out() == static_cast<double>(mx));
    CHECK(std::abs(pmt::ops::squared_norm_value(exec, x) - static_cast<double>(s2)) <=
          1e-12 * static_cast<double>(s2) + 1e-300);
#if defined(KOKKOS_ENABLE_SERIAL) && defined(KOKKOS_ENABLE_OPENMP)
    CHECK(pmt::ops::sum_value(Kokkos::Serial(), x) == pmt::ops::sum_value(Kokkos::OpenMP(), x));
#endif
  }
  auto m  = pmt::make_tensor<T, Host>("m", 97, 13);
  auto cs = pmt::make_tensor<T, Host>("cs", 13), cs2 = pmt::make_tensor<T, Host>("cs2", 13);
  pmt::test::fill_random(m, 8);
  Kokkos::deep_copy(cs, T(1));
  pmt::ops::column_sum(exec, m, cs, T(1));
  exec.fence();
  for (int c = 0; c < 13; ++c) {
    double r = 1;
    for (int i = 0; i < 97; ++i) r += m(i, c);
    CHECK(std::abs(cs(c) - r) <= 8 * pmt::test::tol<T>(97));
  }
#if defined(KOKKOS_ENABLE_SERIAL) && defined(KOKKOS_ENABLE_OPENMP)
  pmt::ops::column_sum(Kokkos::Serial(), m, cs2, T(0));
  pmt::ops::column_sum(Kokkos::OpenMP(), m, cs, T(0));
  Kokkos::fence();
  CHECK(pmt::test::bitwise_equal(cs, cs2));
#endif
  auto empty = pmt::make_tensor<T, Host>("empty", 0);
  Kokkos::View<double, Kokkos::HostSpace> out("out");
  CHECK_THROWS_WITH(pmt::ops::mean(exec, empty, out),
                    Catch::Matchers::StartsWith("pmt::ops::mean: x is (0); expected at least one element"));
}

TEMPLATE_TEST_CASE("SGD with momentum and AdamW follow their update rules", "[ops][optimizer]", float, double) {
  using T = TestType;
  Host exec;
  const int n = 50;
  auto p = pmt::make_tensor<T, Host>("p", n), g = pmt::make_tensor<T, Host>("g", n);
  auto m = pmt::make_tensor<T, Host>("m", n), v = pmt::make_tensor<T, Host>("v", n);
  pmt::test::fill_random(p, 9);
  pmt::test::fill_random(g, 10);
  std::vector<double> rp(n), rm(n, 0), rv(n, 0);
  for (int i = 0; i < n; ++i) rp[i] = p(i);
  pmt::ops::AdamWParams h{1e-2, 0.9, 0.95, 1e-8, 0.1, 1};
  for (int step = 1; step <= 3; ++step) {
    h.step = step;
    pmt::ops::adamw_update(exec, p, g, m, v, h);
    exec.fence();
    for (int i = 0; i < n; ++i) {
      rm[i]           = 0.9 * rm[i] + 0.1 * g(i);
      rv[i]           = 0.95 * rv[i] + 0.05 * g(i) * g(i);
      const double mh = rm[i] / (1 - std::pow(0.9, step)), vh = rv[i] / (1 - std::pow(0.95, step));
      rp[i] -= 1e-2 * (mh / (std::sqrt(vh) + 1e-8) + 0.1 * rp[i]);
    }
  }
  for (int i = 0; i < n; ++i) CHECK(std::abs(p(i) - rp[i]) <= 64 * pmt::test::tol<T>());
  Kokkos::deep_copy(m, T(0));
  for (int i = 0; i < n; ++i) rp[i] = p(i), rm[i] = 0;
  for (int step = 0; step < 3; ++step) {
    pmt::ops::sgd_update(exec, p, g, m, pmt::ops::SgdParams{0.1, 0.9, 0.01});
    exec.fence();
    for (int i = 0; i < n; ++i) {
      rm[i] = 0.9 * rm[i] + g(i) + 0.01 * rp[i];
      rp[i] -= 0.1 * rm[i];
    }
  }
  for (int i = 0; i < n; ++i) CHECK(std::abs(p(i) - rp[i]) <= 64 * pmt::test::tol<T>());
  h.step = 0;
  CHECK_THROWS_AS(pmt::ops::adamw_update(exec, p, g, m, v, h), pmt::ConfigError);
}

namespace {
template <class T>
void multi_tensor_checks() {
  using V = pmt::Tensor<T, 1, Host>;
  Host exec;
  // sizes around the chunks (4096 for norms, 8192 for the updates), an empty tensor and a large one
  const std::vector<std::size_t> sizes{1, 0, 4095, 4096, 4097, 8193, 3, 70001};
  auto make = [&](const char* what, std::uint32_t seed) {
    std::vector<V> a, b;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      a.emplace_back(std::string(what), sizes[i]);
      b.emplace_back(std::string(what), sizes[i]);
      pmt::test::fill_random(a.back(), seed + 10 * static_cast<std::uint32_t>(i));
      Kokkos::deep_copy(b.back(), a.back());
    }
    return std::pair{a, b};
  };
  auto [p1, p2] = make("p", 1);
  auto [g1, g2] = make("g", 2);
  auto [m1, m2] = make("m", 3);
  auto [v1, v2] = make("v", 4);
  for (auto* vs : {&v1, &v2})
    for (auto& x : *vs) pmt::ops::scale(exec, x, T(0));  // second moments start at zero, as AdamW's do
  auto same = [](const std::vector<V>& a, const std::vector<V>& b) {
    bool ok = true;
    for (std::size_t i = 0; i < a.size(); ++i) ok = ok && pmt::test::bitwise_equal(a[i], b[i]);
    return ok;
  };
  pmt::ops::AdamWParams h{1e-2, 0.9, 0.95, 1e-8, 0.1, 1};
  for (int step = 1; step <= 3; ++step) {
    h.step = step;
    pmt::ops::adamw_update_all(exec, p1, g1, m1, v1, h);
    for (std::size_t i = 0; i < sizes.size(); ++i) pmt::ops::adamw_update(exec, p2[i], g2[i], m2[i], v2[i], h);
  }
  exec.fence();
  CHECK(same(p1, p2));
  CHECK(same(m1, m2));
  CHECK(same(v1, v2));
  pmt::ops::sgd_update_all(exec, p1, g1, m1, pmt::ops::SgdParams{0.1, 0.9, 0.01});
  for (std::size_t i = 0; i < sizes.size(); ++i)
    pmt::ops::sgd_update(exec, p2[i], g2[i], m2[i], pmt::ops::SgdParams{0.1, 0.9, 0.01});
  exec.fence();
  CHECK(same(p1, p2));
  CHECK(same(m1, m2));
  const std::vector<double> n2 = pmt::ops::squared_norms(exec, p1);
  REQUIRE(n2.size() == sizes.size());
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    CHECK(n2[i] == pmt::ops::squared_norm_value(exec, p2[i]));  // bitwise: the same chunks and order
    double ref = 0;
    for (std::size_t j = 0; j < sizes[i]; ++j) ref += double(p2[i](j)) * double(p2[i](j));
    CHECK(std::abs(n2[i] - ref) <= 1e-12 * (1 + ref));
  }
  CHECK(n2[1] == 0.0);
  pmt::ops::scale_all(exec, p1, T(0.5));
  for (auto& x : p2) pmt::ops::scale(exec, x, T(0.5));
  exec.fence();
  CHECK(same(p1, p2));
  pmt::ops::zero_all(exec, p1);
  exec.fence();
  for (const auto& x : p1) CHECK(pmt::ops::squared_norm_value(exec, x) == 0.0);
  // a list that does not match the parameters is an error naming the list and the tensor
  std::vector<V> short_m(m1.begin(), m1.end() - 1);
  CHECK_THROWS_WITH(pmt::ops::adamw_update_all(exec, p1, g1, short_m, v1, h),
                    Catch::Matchers::StartsWith("pmt::ops::adamw_update_all: m holds 7 tensors but the parameters 8"));
  std::vector<V> wrong = g1;
  wrong[3]             = V(std::string("wrong"), 5);
  CHECK_THROWS_WITH(pmt::ops::sgd_update_all(exec, p1, wrong, m1, pmt::ops::SgdParams{}),
                    Catch::Matchers::StartsWith("pmt::ops::sgd_update_all: grads[3] is (5) but parameter 3 is (4096)"));
  h.step = 0;
  CHECK_THROWS_AS(pmt::ops::adamw_update_all(exec, p1, g1, m1, v1, h), pmt::ConfigError);
}

// While alive, the multi-tensor ops take their device form (one launch over a chunk table) on the host.
struct ForceTable {
  ForceTable() { pmt::detail::multi_tensor_force_table() = true; }
  ~ForceTable() { pmt::detail::multi_tensor_force_table() = false; }
};
}  // namespace

TEMPLATE_TEST_CASE("multi-tensor zero, scale, squared norms, AdamW and SGD equal the one-tensor ops bitwise",
                   "[ops][optimizer][multi_tensor]", float, double) {
  SECTION("host chunks") { multi_tensor_checks<TestType>(); }
  SECTION("the device form: one launch over a chunk table") {
    const ForceTable force;
    multi_tensor_checks<TestType>();
  }
}

TEST_CASE("the multi-tensor device form copies its tables once: later steps over the same tensors copy none",
          "[ops][optimizer][multi_tensor]") {
  using V = pmt::Tensor<float, 1, Host>;
  Host exec;
  const ForceTable force;
  std::vector<V> p, g, m, v;
  for (std::size_t n : {5, 9000, 17}) {
    for (auto* xs : {&p, &g, &m, &v}) xs->emplace_back(std::string("x"), n);
    pmt::test::fill_random(p.back(), 1), pmt::test::fill_random(g.back(), 2);
  }
  pmt::ops::AdamWParams h{1e-3, 0.9, 0.95, 1e-8, 0.1, 1};
  auto& uploads     = pmt::detail::multi_tensor_uploads();
  const auto before = uploads;
  pmt::ops::adamw_update_all(exec, p, g, m, v, h);
  const auto first_step = uploads - before;
  CHECK(first_step >= 1);
  CHECK(first_step <= 5);  // the chunk table and four pointer tables, at most
  for (int step = 2; step <= 4; ++step) {
    h.step = step;
    pmt::ops::adamw_update_all(exec, p, g, m, v, h);
    pmt::ops::zero_all(exec, g);
  }
  CHECK(uploads - before == first_step);  // zero_all's tables of g are the update's
  // the norms (clipping) in one launch: their chunk table (norm-sized chunks) once, g's pointers kept
  const auto norms = pmt::ops::squared_norms(exec, g);
  CHECK(uploads - before == first_step + 1);
  CHECK(pmt::ops::squared_norms(exec, g) == norms);
  CHECK(uploads - before == first_step + 1);
  // other tensors: their pointer and chunk tables are copied (a table is its contents)
  std::vector<V> q{V(std::string("q"), 7)};
  pmt::ops::zero_all(exec, q);
  CHECK(uploads - before == first_step + 3);
  exec.fence();
  CHECK(q[0](6) == 0.0f);
}
