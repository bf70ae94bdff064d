// SPDX-License-Identifier: Apache-2.0
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include "ops_test.hpp"
#include "pmt/core/random.hpp"
#include "pmt/ops/attention.hpp"
#include "pmt/ops/embedding.hpp"

#include <algorithm>
#include <cmath>
#include <tuple>
#include <vector>

using pmt::test::Host;

TEMPLATE_TEST_CASE("embedding forward and backward equal the reference", "[ops][embedding]", float, double) {
  using T = TestType;
  Host exec;
  const int N = 300, V = 11, C = 6;
  Kokkos::View<int*, Kokkos::LayoutRight, Kokkos::HostSpace> ids("ids", N);
  for (int n = 0; n < N; ++n) ids(n) = (n * n + 3) % V;
  auto table = pmt::make_tensor<T, Host>("table", V, C), out = pmt::make_tensor<T, Host>("out", N, C);
  auto dout = pmt::make_tensor<T, Host>("dout", N, C), dtable = pmt::make_tensor<T, Host>("dtable", V, C);
  pmt::test::fill_random(table, 1);
  pmt::test::fill_random(dout, 2);
  pmt::ops::embedding(exec, ids, table, out);
  pmt::ops::embedding(exec, ids, table, out, pmt::ops::Accumulate::Yes);
  Kokkos::deep_copy(dtable, T(1));
  pmt::ops::embedding_backward(exec, ids, dout, dtable);
  exec.fence();
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < C; ++c) CHECK(out(n, c) == 2 * table(ids(n), c));
  for (int v = 0; v < V; ++v)
    for (int c = 0; c < C; ++c) {
      T ref = 1;  // summed in increasing n, as the op promises
      for (int n = 0; n < N; ++n)
        if (ids(n) == v) ref += dout(n, c);
      CHECK(dtable(v, c) == ref);
    }
  // an ignored id: zeros forward, no contribution backward
  ids(3) = -1;
  pmt::ops::embedding(exec, ids, table, out, pmt::ops::Accumulate::No, -1);
  auto dt2 = pmt::make_tensor<T, Host>("dt2", V, C);
  pmt::ops::embedding_backward(exec, ids, dout, dt2, -1);
  exec.fence();
  for (int c = 0; c < C; ++c) CHECK(out(3, c) == T(0));
  for (int v = 0; v < V; ++v)
    for (int c = 0; c < C; ++c) {
      T ref = 0;
      for (int n = 0; n < N; ++n)
        if (ids(n) == v) ref += dout(n, c);
      CHECK(dt2(v, c) == ref);
    }
  CHECK_THROWS_AS(pmt::ops::embedding(exec, ids, table, out), pmt::ShapeError);  // -1 not ignored
  ids(3) = (3 * 3 + 3) % V;
  ids(7) = V;
  CHECK_THROWS_WITH(
      pmt::ops::embedding(exec, ids, table, out),
      Catch::Matchers::StartsWith("pmt::ops::embedding: 1 of 300 ids lie outside [0, 11); table is (11, 6)"));
}

TEST_CASE("embedding_backward is bitwise the same on Serial and OpenMP", "[ops][embedding][determinism]") {
#if defined(KOKKOS_ENABLE_SERIAL) && defined(KOKKOS_ENABLE_OPENMP)
  const int N = 5000, V = 50, C = 16;
  Kokkos::View<int*, Kokkos::LayoutRight, Kokkos::HostSpace> ids("ids", N);
  for (int n = 0; n < N; ++n) ids(n) = (n * 31 + n / 7) % V;
  auto dout = pmt::make_tensor<float, Kokkos::OpenMP>("dout", N, C);
  auto d1   = pmt::make_tensor<float, Kokkos::OpenMP>("d1", V, C),
       d2   = pmt::make_tensor<float, Kokkos::OpenMP>("d2", V, C);
  pmt::test::fill_random(dout, 3);
  pmt::ops::embedding_backward(Kokkos::Serial(), ids, dout, d1);
  pmt::ops::embedding_backward(Kokkos::OpenMP(), ids, dout, d2);
  Kokkos::fence();
  CHECK(pmt::test::bitwise_equal(d1, d2));
#else
  SKIP("needs both Kokkos::Serial and Kokkos::OpenMP");
#endif
}

namespace {
// Naive causal attention in double: out (B, T, C) from qkv (B, T, 3C).
template <class Q, class O>
void attention_reference(const Q& qkv, const O& out, int H) {
  const int B = qkv.extent(0), T = qkv.extent(1), C = out.extent(2), hs = C / H;
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int t = 0; t < T; ++t) {
        std::vector<double> s(t + 1);
        double mx = -1e300, z = 0;
        for (int u = 0; u <= t; ++u) {
          double d = 0;
          for (int i = 0; i < hs; ++i) d += double(qkv(b, t, h * hs + i)) * qkv(b, u, C + h * hs + i);
          s[u] = d / std::sqrt(double(hs));
          mx   = std::max(mx, s[u]);
        }
        for (int u = 0; u <= t; ++u) z += (s[u] = std::exp(s[u] - mx));
        for (int i = 0; i < hs; ++i) {
          double o = 0;
          for (int u = 0; u <= t; ++u) o += s[u] / z * qkv(b, u, 2 * C + h * hs + i);
          out(b, t, h * hs + i) = o;
        }
      }
}
}  // namespace

namespace {
// While alive, attention takes its generic path (batched matmuls), or (off) the fused host one
// wherever the build has it: the matmul path is pinned to vendor, which pins fused attention.
struct ForceGenericAttention {
  explicit ForceGenericAttention(bool on)
      : saved(pmt::detail::attention_force_generic()), path(pmt::ops::matmul_path()) {
    pmt::detail::attention_force_generic() = on;
    if (!on) pmt::ops::set_matmul_path(pmt::ops::MatmulPath::Vendor);
  }
  ~ForceGenericAttention() {
    pmt::detail::attention_force_generic() = saved;
    pmt::ops::set_matmul_path(path);
  }
  bool saved;
  pmt::ops::MatmulPath path;
};
const char* path_name(bool generic) { return generic ? "generic" : "fused where the build has CBLAS"; }
}  // namespace

// T = 7 fits in one causal panel of the fused path; T = 70 takes three (32, 32, 6 rows).
TEMPLATE_TEST_CASE("causal attention forward equals the naive reference", "[ops][attention]", float, double) {
  using T = TestType;
  Host exec;
  for (const bool generic : {false, true})
    for (const int Tn : {7, 70}) {
      INFO(path_name(generic) << ", T = " << Tn);
      const ForceGenericAttention force(generic);
      const int B = 2, C = 12, H = 3;
      auto qkv = pmt::make_tensor<T, Host>("qkv", B, Tn, 3 * C), out = pmt::make_tensor<T, Host>("out", B, Tn, C);
      auto ref = pmt::make_tensor<double, Host>("ref", B, Tn, C);
      pmt::test::fill_random(qkv, 4);
      auto cache = pmt::ops::make_attention_cache<T, Host>(B, Tn, C, H);
      pmt::ops::attention_forward(exec, qkv, out, cache);
      exec.fence();
      attention_reference(qkv, ref, H);
      CHECK(pmt::test::max_rel_diff(out, ref) <= 16 * pmt::test::tol<T>(C));
      // the softmax output kept for backward: rows sum to 1, zeros past the diagonal
      double worst = 0;
      for (int b = 0; b < B; ++b)
        for (int h = 0; h < H; ++h)
          for (int t = 0; t < Tn; ++t) {
            double sum = 0;
            for (int u = 0; u < Tn; ++u) {
              if (u > t) worst = std::max(worst, std::abs(double(cache.att(b, h, t, u))));
              sum += cache.att(b, h, t, u);
            }
            worst = std::max(worst, std::abs(sum - 1));
          }
      CHECK(worst <= 16 * pmt::test::tol<T>(Tn));
      auto wrong = pmt::make_tensor<T, Host>("wrong", B, Tn + 1, 3 * C);
      CHECK_THROWS_AS(pmt::ops::attention_forward(exec, wrong, out, cache), pmt::ShapeError);
    }
  CHECK_THROWS_WITH(
      (pmt::ops::make_attention_cache<T, Host>(2, 7, 10, 3)),
      Catch::Matchers::StartsWith("pmt::ops::make_attention_cache: width C = 10 is not divisible by heads H = 3"));
}

TEST_CASE("causal attention backward matches finite differences", "[ops][attention][gradient]") {
  Host exec;
  for (const bool generic : {false, true})
    for (const int Tn : {5, 40}) {
      INFO(path_name(generic) << ", T = " << Tn);
      const ForceGenericAttention force(generic);
      const int B = 2, C = 8, H = 2;
      auto qkv  = pmt::make_tensor<double, Host>("qkv", B, Tn, 3 * C),
           out  = pmt::make_tensor<double, Host>("out", B, Tn, C);
      auto w    = pmt::make_tensor<double, Host>("w", B, Tn, C),
           dqkv = pmt::make_tensor<double, Host>("dqkv", B, Tn, 3 * C);
      pmt::test::fill_random(qkv, 5);
      pmt::test::fill_random(w, 6);
      auto cache = pmt::ops::make_attention_cache<double, Host>(B, Tn, C, H);
      auto loss  = [&] {
        pmt::ops::attention_forward(exec, qkv, out, cache);
        exec.fence();
        return pmt::test::weighted_sum(w, out);
      };
      loss();
      pmt::test::fill_random(dqkv, 7);  // every element is overwritten
      pmt::ops::attention_backward(exec, w, dqkv, cache);
      exec.fence();
      CHECK(pmt::test::finite_difference_error(qkv, dqkv, loss) <= 1e-6);
    }
  const int B = 2, Tn = 5, C = 8, H = 2;
  auto dqkv       = pmt::make_tensor<double, Host>("dqkv", B, Tn, 3 * C);
  auto cache      = pmt::ops::make_attention_cache<double, Host>(B, Tn, C, H);
  auto short_dout = pmt::make_tensor<double, Host>("short_dout", B, Tn, C / 2);
  CHECK_THROWS_WITH(
      pmt::ops::attention_backward(exec, short_dout, dqkv, cache),
      Catch::Matchers::StartsWith("pmt::ops::attention_backward: dqkv is (2, 5, 24) and dout is (2, 5, 4) "
                                  "but the cache was made for B = 2, T = 5, C = 8, H = 2"));
}

TEMPLATE_TEST_CASE("the fused host attention equals the generic one", "[ops][attention]", float, double) {
  using T = TestType;
  Host exec;
  const int B = 2, Tn = 70, C = 12, H = 3;
  auto qkv = pmt::make_tensor<T, Host>("qkv", B, Tn, 3 * C), dout = pmt::make_tensor<T, Host>("dout", B, Tn, C);
  pmt::test::fill_random(qkv, 21);
  pmt::test::fill_random(dout, 22);
  auto run = [&](bool generic) {
    const ForceGenericAttention force(generic);
    auto cache = pmt::ops::make_attention_cache<T, Host>(B, Tn, C, H);
    auto out = pmt::make_tensor<T, Host>("out", B, Tn, C), dqkv = pmt::make_tensor<T, Host>("dqkv", B, Tn, 3 * C);
    pmt::ops::attention_forward(exec, qkv, out, cache);
    pmt::ops::attention_backward(exec, dout, dqkv, cache);
    exec.fence();
    return std::make_tuple(out, dqkv, cache.att);
  };
  const auto [out_f, dqkv_f, att_f] = run(false);
  const auto [out_g, dqkv_g, att_g] = run(true);
  CHECK(pmt::test::max_rel_diff(out_f, out_g) <= 4 * pmt::test::tol<T>(Tn));
  CHECK(pmt::test::max_rel_diff(att_f, att_g) <= 4 * pmt::test::tol<T>(Tn));
  CHECK(pmt::test::max_rel_diff(dqkv_f, dqkv_g) <= 16 * pmt::test::tol<T>(Tn));
}

TEMPLATE_TEST_CASE("attention on separate q, k, v equals attention on the packed qkv, bitwise", "[ops][attention]",
                   float, double) {
  using T = TestType;
  Host exec;
  const int B = 2, Tn = 6, C = 8, H = 2;
  auto qkv = pmt::make_tensor<T, Host>("qkv", B, Tn, 3 * C), dout = pmt::make_tensor<T, Host>("dout", B, Tn, C);
  pmt::test::fill_random(qkv, 11);
  pmt::test::fill_random(dout, 12);
  auto part = [&](const char* name, int which) {  // q, k or v as its own (B, T, C) tensor
    auto t = pmt::make_tensor<T, Host>(name, B, Tn, C);
    for (int b = 0; b < B; ++b)
      for (int t_ = 0; t_ < Tn; ++t_)
        for (int c = 0; c < C; ++c) t(b, t_, c) = qkv(b, t_, which * C + c);
    return t;
  };
  auto q = part("q", 0), k = part("k", 1), v = part("v", 2);
  auto packed = pmt::ops::make_attention_cache<T, Host>(B, Tn, C, H);
  auto split  = pmt::ops::make_attention_cache<T, Host>(B, Tn, C, H);
  auto out1 = pmt::make_tensor<T, Host>("out1", B, Tn, C), out2 = pmt::make_tensor<T, Host>("out2", B, Tn, C);
  pmt::ops::attention_forward(exec, qkv, out1, packed);
  pmt::ops::attention_forward(exec, q, k, v, out2, split);
  auto dqkv = pmt::make_tensor<T, Host>("dqkv", B, Tn, 3 * C);
  auto dq = pmt::make_tensor<T, Host>("dq", B, Tn, C), dk = pmt::make_tensor<T, Host>("dk", B, Tn, C),
       dv = pmt::make_tensor<T, Host>("dv", B, Tn, C);
  pmt::ops::attention_backward(exec, dout, dqkv, packed);
  pmt::ops::attention_backward(exec, dout, dq, dk, dv, split);
  exec.fence();
  CHECK(pmt::test::bitwise_equal(out1, out2));
  bool same = true;
  for (int b = 0; b < B; ++b)
    for (int t_ = 0; t_ < Tn; ++t_)
      for (int c = 0; c < C; ++c)
        same = same && dqkv(b, t_, c) == dq(b, t_, c) && dqkv(b, t_, C + c) == dk(b, t_, c) &&
               dqkv(b, t_, 2 * C + c) == dv(b, t_, c);
  CHECK(same);
  auto short_k = pmt::make_tensor<T, Host>("short_k", B, Tn - 1, C);
  CHECK_THROWS_WITH(
      pmt::ops::attention_forward(exec, q, short_k, v, out2, split),
      Catch::Matchers::StartsWith("pmt::ops::attention_forward: q is (2, 6, 8), k (2, 5, 8), v (2, 6, 8) "
                                  "and out (2, 6, 8) but the cache was made for B = 2, T = 6, C = 8, H = 2"));
}

TEST_CASE("the RNG gives an element the same value from any slice of the tensor", "[core][random]") {
  Host exec;
  const pmt::RngKey key{1234, 7};
  auto full = pmt::make_tensor<float, Host>("full", 12, 20);
  pmt::fill_normal(exec, full, key, 0.0, 0.02);
  // a column shard (as TensorSplit<Col> holds) and a row shard
  auto col = pmt::make_tensor<float, Host>("col", 12, 5);
  pmt::GlobalSlice cs;
  cs.extent[0] = 12, cs.extent[1] = 20, cs.offset[1] = 15;
  pmt::fill_normal(exec, col, key, 0.0, 0.02, cs);
  auto row = pmt::make_tensor<float, Host>("row", 3, 20);
  pmt::GlobalSlice rs;
  rs.extent[0] = 12, rs.extent[1] = 20, rs.offset[0] = 6;
  pmt::fill_normal(exec, row, key, 0.0, 0.02, rs);
  exec.fence();
  bool same = true;
  for (int i = 0; i < 12; ++i)
    for (int j = 0; j < 5; ++j) same = same && col(i, j) == full(i, 15 + j);
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 20; ++j) same = same && row(i, j) == full(6 + i, j);
  CHECK(same);
#if defined(KOKKOS_ENABLE_SERIAL) && defined(KOKKOS_ENABLE_OPENMP)
  auto serial = pmt::make_tensor<float, Host>("serial", 12, 20);
  pmt::fill_normal(Kokkos::Serial(), serial, key, 0.0, 0.02);
  Kokkos::fence();
  CHECK(pmt::test::bitwise_equal(serial, full));
#endif
  // moments of a large draw, and different streams differ
  auto big = pmt::make_tensor<double, Host>("big", 200000);
  pmt::fill_normal(exec, big, key, 1.0, 2.0);
  auto uni = pmt::make_tensor<double, Host>("uni", 200000);
  pmt::fill_uniform(exec, uni, pmt::RngKey{1234, 8}, -1.0, 3.0);
  exec.fence();
  double m = 0, v = 0, mu = 0, lo = 10, hi = -10;
  for (int i = 0; i < 200000; ++i) m += big(i), mu += uni(i), lo = std::min(lo, uni(i)), hi = std::max(hi, uni(i));
  m /= 200000, mu /= 200000;
  for (int i = 0; i < 200000; ++i) v += (big(i) - m) * (big(i) - m);
  v /= 200000;
  CHECK(std::abs(m - 1.0) < 0.02);
  CHECK(std::abs(std::sqrt(v) - 2.0) < 0.02);
  CHECK(std::abs(mu - 1.0) < 0.02);
  CHECK(lo >= -1.0);
  CHECK(hi <= 3.0);
  pmt::GlobalSlice too_far;
  too_far.extent[0] = 12, too_far.extent[1] = 20, too_far.offset[1] = 16;
  CHECK_THROWS_WITH(pmt::fill_normal(exec, col, key, 0.0, 1.0, too_far),
                    Catch::Matchers::StartsWith(
                        "pmt::fill_normal: the local tensor (12, 5) does not fit in the global slice along dim 1"));
}
