// SPDX-License-Identifier: Apache-2.0
// split and Mesh: for every factorisation dp x tp x pp of the world size (np = 1, 2, 4, 8), each
// axis communicator holds exactly the expected world ranks, in axis order.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include "comm_test.hpp"

#include <vector>

using Host = Kokkos::DefaultHostExecutionSpace;

namespace {

template <class C>
std::vector<int> world_ranks_in(const C& axis_comm, int world_rank) {
  Kokkos::View<int*, Kokkos::LayoutRight, Host::memory_space> mine("mine", 1), all("all", axis_comm.size());
  mine(0) = world_rank;
  pmt::comm::all_gather(axis_comm, Host(), mine, all);
  return std::vector<int>(all.data(), all.data() + all.size());
}

}  // namespace

TEST_CASE("split groups ranks by color and orders them by key", "[comm][split][mpi]") {
  const auto& w = pmt::test::world();
  const int r = w.rank(), n = w.size();
  auto half = w.split(r % 2, -r);  // reverse order inside each parity class
  std::vector<int> expect;
  for (int q = n - 1; q >= 0; --q)
    if (q % 2 == r % 2) expect.push_back(q);
  CHECK(pmt::test::all_ranks(world_ranks_in(half, r) == expect));
}

TEST_CASE("Mesh axis communicators hold the expected ranks for every factorisation", "[comm][mesh][mpi]") {
  const auto& w = pmt::test::world();
  const int n = w.size(), r = w.rank();
  int layouts = 0;
  for (int pp = 1; pp <= n; ++pp)
    for (int dp = 1; dp <= n; ++dp) {
      if (n % (pp * dp) != 0) continue;
      const int tp = n / (pp * dp);
      ++layouts;
      pmt::Mesh<pmt::test::World::backend> mesh(w, pmt::MeshShape{dp, tp, pp});
      const int d = mesh.coord(pmt::Axis::dp), t = mesh.coord(pmt::Axis::tp), p = mesh.coord(pmt::Axis::pp);
      bool ok = mesh.world_rank_of(d, t, p) == r && r == t + tp * (d + dp * p);  // tp fastest, then dp, pp
      std::vector<int> e_dp, e_tp, e_pp;
      for (int i = 0; i < dp; ++i) e_dp.push_back(mesh.world_rank_of(i, t, p));
      for (int i = 0; i < tp; ++i) e_tp.push_back(mesh.world_rank_of(d, i, p));
      for (int i = 0; i < pp; ++i) e_pp.push_back(mesh.world_rank_of(d, t, i));
      ok = ok && world_ranks_in(mesh.comm(pmt::Axis::dp), r) == e_dp;
      ok = ok && world_ranks_in(mesh.comm(pmt::Axis::tp), r) == e_tp;
      ok = ok && world_ranks_in(mesh.comm(pmt::Axis::pp), r) == e_pp;
      ok = ok && mesh.degree(pmt::Axis::dp) == dp && mesh.degree(pmt::Axis::tp) == tp &&
           mesh.degree(pmt::Axis::pp) == pp && mesh.comm(pmt::Axis::tp).rank() == t;
      INFO("layout dp " << dp << " tp " << tp << " pp " << pp << " on rank " << r << " (" << mesh.where() << ")");
      CHECK(pmt::test::all_ranks(ok));
    }
  // ordered factorisations into three factors: 1 -> 1, 2 -> 3, 4 -> 6, 8 -> 10
  const int expected_layouts = n == 1 ? 1 : n == 2 ? 3 : n == 4 ? 6 : n == 8 ? 10 : layouts;
  CHECK(layouts == expected_layouts);
}

TEST_CASE("a Mesh whose degrees do not multiply to the world size names every factor", "[comm][mesh][errors][mpi]") {
  const auto& w = pmt::test::world();
  const int n   = w.size();
  using Catch::Matchers::StartsWith;
  CHECK_THROWS_AS(pmt::Mesh<pmt::test::World::backend>(w, pmt::MeshShape{2, 2, n + 1}), pmt::ConfigError);
  CHECK_THROWS_WITH(pmt::Mesh<pmt::test::World::backend>(w, pmt::MeshShape{n + 1, 1, 2}),
                    StartsWith("pmt::Mesh: dp(" + std::to_string(n + 1) + ") * tp(1) * pp(2) = " +
                               std::to_string(2 * (n + 1)) + " != world size " + std::to_string(n)));
  CHECK_THROWS_WITH(pmt::Mesh<pmt::test::World::backend>(w, pmt::MeshShape{0, n, 1}),
                    StartsWith("pmt::Mesh: dp(0), tp(" + std::to_string(n) + "), pp(1): every degree must be >= 1"));
}
