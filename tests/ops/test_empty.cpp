// SPDX-License-Identifier: Apache-2.0
// Tensors with no rows or no columns (a tp shard of nothing, an empty microbatch, a K = 0 split):
// every op either does nothing, leaving what it accumulates into untouched, or raises a ShapeError
// that names the op and the shape. Under scripts/check.sh (ASan, UBSan, Kokkos View bounds
// checking) this also proves that no op forms a row pointer into an empty row.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include "ops_test.hpp"
#include "pmt/ops/attention.hpp"
#include "pmt/ops/cross_entropy.hpp"
#include "pmt/ops/elementwise.hpp"
#include "pmt/ops/embedding.hpp"
#include "pmt/ops/layernorm.hpp"
#include "pmt/ops/matmul.hpp"
#include "pmt/ops/reduction.hpp"
#include "pmt/ops/softmax.hpp"
#include "pmt/ops/update.hpp"

#include <cstdint>

using Catch::Matchers::StartsWith;
using pmt::test::Host;

namespace {

template <class T>
auto tensor(const char* name, std::size_t n, std::size_t c) {
  return pmt::make_tensor<T, Host>(name, n, c);
}

}  // namespace

TEST_CASE("ops on tensors with no rows do nothing", "[ops][empty]") {
  Host exec;
  const std::size_t C = 8;
  auto x = tensor<float>("x", 0, C), y = tensor<float>("y", 0, C), dy = tensor<float>("dy", 0, C),
       dx = tensor<float>("dx", 0, C);
  auto w = pmt::make_tensor<float, Host>("w", C), b = pmt::make_tensor<float, Host>("b", C);
  auto dw = pmt::make_tensor<float, Host>("dw", C), db = pmt::make_tensor<float, Host>("db", C);
  auto mean = pmt::make_tensor<float, Host>("mean", 0), rstd = pmt::make_tensor<float, Host>("rstd", 0);
  Kokkos::deep_copy(dw, 2.0f);
  Kokkos::deep_copy(db, 3.0f);
  pmt::ops::layernorm_forward(exec, x, w, b, y, mean, rstd);
  pmt::ops::layernorm_backward(exec, dy, x, w, mean, rstd, dx, dw, db);
  pmt::ops::softmax(exec, x, y);
  pmt::ops::softmax(exec, x, y, pmt::ops::Mask::Causal);
  pmt::ops::softmax_backward(exec, y, dy, dx);
  pmt::ops::log_softmax(exec, x, y);
  pmt::ops::log_softmax_backward(exec, y, dy, dx);
  pmt::ops::bias_add(exec, y, w);
  pmt::ops::column_sum(exec, dy, db, 1.0f);
  auto ids   = pmt::make_tensor<std::int32_t, Host>("ids", 0);
  auto table = tensor<float>("table", 5, C), dtable = tensor<float>("dtable", 5, C);
  Kokkos::deep_copy(dtable, 4.0f);
  pmt::ops::embedding(exec, ids, table, y);
  pmt::ops::embedding_backward(exec, ids, dy, dtable);
  auto loss = pmt::make_tensor<float, Host>("loss");
  Kokkos::deep_copy(loss, 7.0f);
  pmt::ops::softmax_cross_entropy(exec, x, ids, 1.0, loss, dx);
  exec.fence();
  for (std::size_t c = 0; c < C; ++c) {
    CHECK(dw(c) == 2.0f);  // += of nothing
    CHECK(db(c) == 3.0f);  // column sums of no rows, beta = 1
    for (std::size_t v = 0; v < 5; ++v) CHECK(dtable(v, c) == 4.0f);
  }
  CHECK(loss() == 0.0f);  // the sum of no token losses
  // attention over a batch of none, and over sequences of no tokens
  for (auto [B, T] : {std::pair<int, int>{0, 4}, {2, 0}}) {
    auto cache = pmt::ops::make_attention_cache<float, Host>(B, T, C, 2);
    auto qkv = pmt::make_tensor<float, Host>("qkv", B, T, 3 * C), out = pmt::make_tensor<float, Host>("out", B, T, C);
    auto dqkv = pmt::make_tensor<float, Host>("dqkv", B, T, 3 * C),
         dout = pmt::make_tensor<float, Host>("dout", B, T, C);
    pmt::ops::attention_forward(exec, qkv, out, cache);
    pmt::ops::attention_backward(exec, dout, dqkv, cache);
  }
  // elementwise, optimizer and reduction kernels over no elements
  auto e = pmt::make_tensor<float, Host>("e", 0), e2 = pmt::make_tensor<float, Host>("e2", 0),
       e3 = pmt::make_tensor<float, Host>("e3", 0), e4 = pmt::make_tensor<float, Host>("e4", 0);
  pmt::ops::gelu(exec, e, e2);
  pmt::ops::gelu_backward(exec, e, e2, e3);
  pmt::ops::relu(exec, e, e2);
  pmt::ops::add(exec, e, e2, e3);
  pmt::ops::axpy(exec, 2.0f, e, e2);
  pmt::ops::scale(exec, e, 2.0f);
  pmt::ops::adamw_update(exec, e, e2, e3, e4, pmt::ops::AdamWParams{});
  pmt::ops::sgd_update(exec, e, e2, e3, pmt::ops::SgdParams{});
  auto s = pmt::make_tensor<float, Host>("s");
  pmt::ops::sum(exec, e, s);
  exec.fence();
  CHECK(s() == 0.0f);
  CHECK(pmt::ops::squared_norm_value(exec, e) == 0.0);
  CHECK_THROWS_WITH(pmt::ops::max(exec, e, s), StartsWith("pmt::ops::max: x is (0); expected at least one element"));
  CHECK_THROWS_WITH(pmt::ops::mean(exec, e, s), StartsWith("pmt::ops::mean: x is (0); expected at least one element"));
}

TEST_CASE("ops on rows of no features do nothing, or raise where the result would be undefined", "[ops][empty]") {
  Host exec;
  const std::size_t N = 4;
  auto x = tensor<float>("x", N, 0), y = tensor<float>("y", N, 0), dy = tensor<float>("dy", N, 0),
       dx = tensor<float>("dx", N, 0);
  auto w = pmt::make_tensor<float, Host>("w", 0), b = pmt::make_tensor<float, Host>("b", 0);
  auto mean = pmt::make_tensor<float, Host>("mean", N), rstd = pmt::make_tensor<float, Host>("rstd", N);
  // layernorm: the mean and variance of no features are undefined
  CHECK_THROWS_WITH(pmt::ops::layernorm_forward(exec, x, w, b, y, mean, rstd),
                    StartsWith("pmt::ops::layernorm_forward: x is (4, 0); a row needs at least one feature"));
  CHECK_THROWS_WITH(pmt::ops::layernorm_backward(exec, dy, x, w, mean, rstd, dx, w, b),
                    StartsWith("pmt::ops::layernorm_backward: x is (4, 0); a row needs at least one feature"));
  // softmax over rows of nothing: nothing to write
  pmt::ops::softmax(exec, x, y);
  pmt::ops::softmax_backward(exec, y, dy, dx);
  pmt::ops::log_softmax(exec, x, y);
  pmt::ops::log_softmax_backward(exec, y, dy, dx);
  CHECK_THROWS_WITH(pmt::ops::softmax(exec, x, y, pmt::ops::Mask::Causal),
                    StartsWith("pmt::ops::softmax: x is (4, 0); a causal mask needs rows <= cols"));
  // cross-entropy over no classes: a target is out of range, unless every row is ignored
  auto targets = pmt::make_tensor<std::int32_t, Host>("targets", N);
  auto loss    = pmt::make_tensor<float, Host>("loss");
  CHECK_THROWS_WITH(pmt::ops::softmax_cross_entropy(exec, x, targets, 1.0, loss, dx),
                    StartsWith("pmt::ops::softmax_cross_entropy: 4 of 4 targets lie outside [0, 0)"));
  Kokkos::deep_copy(targets, -100);
  Kokkos::deep_copy(loss, 7.0f);
  pmt::ops::softmax_cross_entropy(exec, x, targets, 1.0, loss, dx);
  exec.fence();
  CHECK(loss() == 0.0f);
  // embedding rows of no features: the ids are still checked
  auto ids   = pmt::make_tensor<std::int32_t, Host>("ids", N);
  auto table = tensor<float>("table", 5, 0);
  pmt::ops::embedding(exec, ids, table, y);
  pmt::ops::embedding_backward(exec, ids, dy, table);
  Kokkos::deep_copy(ids, 9);
  CHECK_THROWS_WITH(pmt::ops::embedding(exec, ids, table, y),
                    StartsWith("pmt::ops::embedding: 4 of 4 ids lie outside [0, 5)"));
  pmt::ops::bias_add(exec, y, w);
  pmt::ops::column_sum(exec, x, w, 1.0f);
  // attention with heads of no features: raise up front
  CHECK_THROWS_WITH((pmt::ops::make_attention_cache<float, Host>(2, 4, 0, 2)),
                    StartsWith("pmt::ops::make_attention_cache: (B, T, C) = (2, 4, 0); expected C > 0"));
  // matmul with an inner dimension of 0: C = beta C, for every backend
  auto A = tensor<float>("A", 3, 0), B = tensor<float>("B", 0, 5), Cm = tensor<float>("C", 3, 5);
  Kokkos::deep_copy(Cm, 2.0f);
  pmt::ops::matmul(exec, pmt::ops::Trans::N, pmt::ops::Trans::N, 1.0f, A, B, 0.5f, Cm);
  pmt::ops::matmul(exec, pmt::ops::Trans::N, pmt::ops::Trans::N, 1.0f, A, B, 0.5f, Cm, pmt::ops::MatmulPortable{});
  exec.fence();
  for (std::size_t i = 0; i < 3; ++i)
    for (std::size_t j = 0; j < 5; ++j) CHECK(Cm(i, j) == 0.5f);
}
