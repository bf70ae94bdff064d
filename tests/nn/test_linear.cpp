// SPDX-License-Identifier: Apache-2.0
// Linear<TensorSplit<Col|Row>> and the Col -> Gelu -> Row Mlp equal the one-rank layers (design
// invariant 4): forward outputs, input gradients and every parameter gradient slice, at
// tp = np (1, 2, 4), float and double. The one-rank reference runs on each rank over its own
// one-rank communicator; initialisation is keyed by global index, so both start equal.
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include "../comm/comm_test.hpp"
#include "../ops/ops_test.hpp"
#include "pmt/nn/linear.hpp"
#include "pmt/nn/mlp.hpp"

#include <cmath>

using Host    = Kokkos::DefaultHostExecutionSpace;
using Backend = pmt::test::World::backend;
template <class T>
using T2 = pmt::Tensor<T, 2, Host>;

namespace {

template <class T>
double tolerance() {
  return std::is_same_v<T, double> ? 1e-12 : 2e-6;
}

/// max |a(i, j) - b(i, col0 + j)| / max(1, |b|) over a's elements (a is a column block of b).
template <class A, class B>
double block_diff(const A& a, const B& b, std::size_t row0, std::size_t col0) {
  double worst = 0;
  for (std::size_t i = 0; i < a.extent(0); ++i)
    for (std::size_t j = 0; j < a.extent(1); ++j) {
      const double ref = b(row0 + i, col0 + j);
      worst            = std::max(worst, std::abs(double(a(i, j)) - ref) / std::max(1.0, std::abs(ref)));
    }
  return worst;
}

template <class T>
T2<T> columns(const T2<T>& x, std::size_t c0, std::size_t n) {
  T2<T> out("cols", x.extent(0), n);
  for (std::size_t i = 0; i < x.extent(0); ++i)
    for (std::size_t j = 0; j < n; ++j) out(i, j) = x(i, c0 + j);
  return out;
}

template <class P>
auto as2(P& p) {
  return p.value2d();
}

}  // namespace

TEMPLATE_TEST_CASE("Linear<TensorSplit<Col>> and <Row> equal the serial Linear forward and backward",
                   "[nn][linear][tp][mpi]", float, double) {
  using T       = TestType;
  const auto& w = pmt::test::world();
  const int tp = w.size(), r = w.rank();
  Host exec;
  pmt::Mesh<Backend> one(w.split(r, 0), pmt::MeshShape{});  // this rank alone: the reference
  pmt::Mesh<Backend> mesh(w, pmt::MeshShape{1, tp, 1});
  const std::size_t N = 5, in = 16, out = 24;  // 24 divides by 1, 2, 4
  const pmt::RngKey key{7, 3};
  T2<T> x("x", N, in), dy("dy", N, out), xr("xr", N, out), dyr("dyr", N, in);
  pmt::test::fill_random(x, 11);
  pmt::test::fill_random(dy, 12);
  pmt::test::fill_random(xr, 13);
  pmt::test::fill_random(dyr, 14);
  bool ok = true;
  {  // Col: in -> out/tp
    pmt::nn::Linear<T, pmt::Replicate, Host, Backend> ref(one, in, out, key);
    pmt::nn::Linear<T, pmt::TensorSplit<pmt::Col>, Host, Backend> col(mesh, in, out, key);
    Kokkos::deep_copy(ref.bias().value, T(0.5));  // a non-zero bias, the same slice on both
    Kokkos::deep_copy(col.bias().value, T(0.5));
    const std::size_t ol = out / tp, c0 = r * ol;
    auto y_ref  = ref.forward(exec, x);
    auto y      = col.forward(exec, x);
    auto dx_ref = ref.backward(exec, dy);
    auto dx     = col.backward(exec, columns<T>(dy, c0, ol));
    exec.fence();
    ok = ok && block_diff(as2(col.weight()), as2(ref.weight()), 0, c0) == 0.0;  // same initial slice
    ok = ok && block_diff(y, y_ref, 0, c0) <= tolerance<T>();
    ok = ok && block_diff(dx, dx_ref, 0, 0) <= tolerance<T>();
    ok = ok && block_diff(col.weight().grad2d(), ref.weight().grad2d(), 0, c0) <= tolerance<T>();
    for (std::size_t j = 0; j < ol; ++j)
      ok = ok && std::abs(col.bias().grad(j) - ref.bias().grad(c0 + j)) <= tolerance<T>() * 8;
    ok = ok && col.weight().bytes() == in * out / tp * sizeof(T) && col.bias().bytes() == out / tp * sizeof(T);
    ok = ok && !col.weight().tp_replicated && !col.bias().tp_replicated;
  }
  {  // Row: in/tp -> out (all-reduced)
    pmt::nn::Linear<T, pmt::Replicate, Host, Backend> ref(one, out, in, key);
    pmt::nn::Linear<T, pmt::TensorSplit<pmt::Row>, Host, Backend> row(mesh, out, in, key);
    const std::size_t il = out / tp, r0 = r * il;
    auto y_ref  = ref.forward(exec, xr);
    auto y      = row.forward(exec, columns<T>(xr, r0, il));
    auto dx_ref = ref.backward(exec, dyr);
    auto dx     = row.backward(exec, dyr);
    exec.fence();
    ok = ok && block_diff(y, y_ref, 0, 0) <= tolerance<T>();
    ok = ok && block_diff(dx, dx_ref, 0, r0) <= tolerance<T>();
    ok = ok && block_diff(row.weight().grad2d(), ref.weight().grad2d(), r0, 0) <= tolerance<T>();
    ok = ok && row.weight().bytes() == out / tp * in * sizeof(T) && row.bias().bytes() == in * sizeof(T);
    ok = ok && row.bias().tp_replicated;
  }
  CHECK(pmt::test::all_ranks(ok));
}

TEMPLATE_TEST_CASE("the Col -> Gelu -> Row Mlp equals the serial Mlp, forward and backward", "[nn][mlp][tp][mpi]",
                   float, double) {
  using T       = TestType;
  const auto& w = pmt::test::world();
  const int tp = w.size(), r = w.rank();
  Host exec;
  pmt::Mesh<Backend> one(w.split(r, 0), pmt::MeshShape{});
  pmt::Mesh<Backend> mesh(w, pmt::MeshShape{1, tp, 1});
  const std::size_t N = 6, d = 12, hidden = 32;
  auto ref = pmt::nn::make_mlp<T, Host, Backend>(one, d, hidden, 42, 10);
  auto mlp = pmt::nn::make_mlp<T, Host, Backend>(mesh, d, hidden, 42, 10);
  T2<T> x("x", N, d), dy("dy", N, d);
  pmt::test::fill_random(x, 21);
  pmt::test::fill_random(dy, 22);
  auto y_ref = ref.forward(exec, x), y = mlp.forward(exec, x);
  auto dx_ref = ref.backward(exec, dy), dx = mlp.backward(exec, dy);
  exec.fence();
  const std::size_t hl = hidden / tp;
  bool ok              = block_diff(y, y_ref, 0, 0) <= tolerance<T>() && block_diff(dx, dx_ref, 0, 0) <= tolerance<T>();
  ok = ok && block_diff(mlp.template get<0>().weight().grad2d(), ref.template get<0>().weight().grad2d(), 0, r * hl) <=
                 tolerance<T>();
  ok = ok && block_diff(mlp.template get<2>().weight().grad2d(), ref.template get<2>().weight().grad2d(), r * hl, 0) <=
                 tolerance<T>();
  ok = ok && mlp.parameters().size() == 4;
  CHECK(pmt::test::all_ranks(ok));
}

TEST_CASE("Linear names the layer, the extents and tp when sizes do not fit", "[nn][linear][errors][mpi]") {
  const auto& w = pmt::test::world();
  const int tp  = w.size();
  pmt::Mesh<Backend> mesh(w, pmt::MeshShape{1, tp, 1});
  using Catch::Matchers::StartsWith;
  if (tp > 1) {
    CHECK_THROWS_WITH((pmt::nn::Linear<float, pmt::TensorSplit<pmt::Col>, Host, Backend>(mesh, 8, tp + 1, {1, 1})),
                      StartsWith("pmt::nn::Linear<TensorSplit<Col>>: out_features " + std::to_string(tp + 1) +
                                 " is not divisible by tp = " + std::to_string(tp)));
    CHECK_THROWS_AS((pmt::nn::Linear<float, pmt::TensorSplit<pmt::Row>, Host, Backend>(mesh, tp + 1, 8, {1, 1})),
                    pmt::ShapeError);
  }
  pmt::nn::Linear<float, pmt::TensorSplit<pmt::Row>, Host, Backend> row(mesh, 8 * tp, 4, {1, 1});
  T2<float> wrong("wrong", 3, 9);  // the shard is 8 wide at every tp
  CHECK_THROWS_WITH(row.forward(Host(), wrong),
                    StartsWith("pmt::nn::Linear<TensorSplit<Row>>::forward: x is (3, 9) but this layer takes (N, 8) "
                               "(in_features " +
                               std::to_string(8 * tp) + " / tp " + std::to_string(tp) + ")"));
  CHECK(pmt::test::all_ranks(true));
}

// A user-defined layer policy, added the documented way: a policy_traits specialization.
struct Mirror {};
template <>
struct pmt::policy_traits<Mirror> : pmt::policy_traits<pmt::Replicate> {};

TEST_CASE("a user-defined layer policy plugs into Linear through policy_traits", "[nn][linear][policy]") {
  pmt::comm::Communicator<pmt::comm::Self> self;
  pmt::Mesh<pmt::comm::Self> one(self, pmt::MeshShape{});
  pmt::nn::Linear<double, Mirror, Host, pmt::comm::Self> mine(one, 6, 4, {3, 3});
  pmt::nn::Linear<double, pmt::Replicate, Host, pmt::comm::Self> plain(one, 6, 4, {3, 3});
  T2<double> x("x", 2, 6);
  pmt::test::fill_random(x, 5);
  CHECK(pmt::test::bitwise_equal(mine.forward(Host(), x), plain.forward(Host(), x)));
  CHECK(mine.name() == "pmt::nn::Linear<user policy>");
}
