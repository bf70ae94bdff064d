// SPDX-License-Identifier: Apache-2.0
// The conjugate regions on the world as one axis: reduce_from and copy_to_backward sum over the
// ranks; scatter_to keeps this rank's columns and gather_from puts every rank's columns back in
// rank order, so gather_from(scatter_to(x)) == x and each is the other's backward; on one rank
// every region is the identity.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include "../comm/comm_test.hpp"
#include "pmt/parallel/regions.hpp"

using Host = Kokkos::DefaultHostExecutionSpace;

TEST_CASE("conjugate regions: sums, column scatter and gather", "[parallel][regions][mpi]") {
  const auto& w = pmt::test::world();
  const int p = w.size(), r = w.rank();
  const std::size_t N = 3, C = 4 * static_cast<std::size_t>(p);
  pmt::Tensor<double, 2, Host> x("x", N, C);
  for (std::size_t n = 0; n < N; ++n)
    for (std::size_t j = 0; j < C; ++j) x(n, j) = 100.0 * double(n) + double(j);
  // every rank holds x; scatter_to keeps columns [r C/p, (r+1) C/p)
  const auto mine = pmt::parallel::scatter_to(w, Host(), x);
  Host().fence();
  bool ok = mine.extent(0) == N && mine.extent(1) == C / std::size_t(p);
  for (std::size_t n = 0; ok && n < N; ++n)
    for (std::size_t j = 0; j < mine.extent(1); ++j)
      ok = ok && mine(n, j) == x(n, std::size_t(r) * (C / std::size_t(p)) + j);
  CHECK(pmt::test::all_ranks(ok));
  // gather_from puts them back; it is scatter_to's backward and scatter_to is its backward
  const auto whole = pmt::parallel::scatter_to_backward(w, Host(), mine);
  Host().fence();
  ok = whole.extent(1) == C;
  for (std::size_t n = 0; ok && n < N; ++n)
    for (std::size_t j = 0; j < C; ++j) ok = ok && whole(n, j) == x(n, j);
  CHECK(pmt::test::all_ranks(ok));
  const auto again = pmt::parallel::gather_from_backward(w, Host(), whole);
  Host().fence();
  ok = again.extent(1) == mine.extent(1);
  for (std::size_t n = 0; ok && n < N; ++n)
    for (std::size_t j = 0; j < again.extent(1); ++j) ok = ok && again(n, j) == mine(n, j);
  CHECK(pmt::test::all_ranks(ok));
  // reduce_from (forward) and copy_to_backward: the sum over ranks, in place; max with an op
  pmt::Tensor<double, 1, Host> v("v", 2);
  v(0) = r + 1, v(1) = -r;
  pmt::parallel::reduce_from(w, Host(), v);
  Host().fence();
  CHECK(v(0) == p * (p + 1) / 2.0);
  CHECK(v(1) == -p * (p - 1) / 2.0);
  v(0) = r;
  pmt::parallel::reduce_from(w, Host(), v, pmt::parallel::ReduceOp::Max);
  pmt::parallel::copy_to_backward(w, Host(), v);  // now summed: p copies of the max
  Host().fence();
  CHECK(v(0) == double(p) * (p - 1));
  // copy_to and reduce_from_backward are the identity: the same View
  CHECK(pmt::parallel::copy_to(w, Host(), x).data() == x.data());
  CHECK(pmt::parallel::reduce_from_backward(w, Host(), x).data() == x.data());
  // columns that do not divide over the ranks
  if (p > 1) {
    pmt::Tensor<double, 2, Host> odd("odd", 2, std::size_t(p) + 1);
    CHECK_THROWS_WITH(
        pmt::parallel::scatter_to(w, Host(), odd),
        Catch::Matchers::ContainsSubstring("pmt::parallel::scatter_to: x is (2, " + std::to_string(p + 1) + ")"));
  }
}
