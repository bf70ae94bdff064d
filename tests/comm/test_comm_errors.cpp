// SPDX-License-Identifier: Apache-2.0
// Error paths of the communicators: argument checks, MPI errors as pmt::CommError, debug-mode
// mismatches that raise on every rank instead of hanging, NCCL without a GPU.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include "comm_test.hpp"
#include "pmt/comm/nccl.hpp"

#include <chrono>
#include <thread>

using Catch::Matchers::ContainsSubstring;
using Catch::Matchers::StartsWith;
using pmt::comm::ReduceOp;
using Host = Kokkos::DefaultHostExecutionSpace;

TEST_CASE("collectives check sizes, roots, contiguity and Avg's type before communicating", "[comm][errors][mpi]") {
  const auto& c = pmt::test::world();
  Host exec;
  const int n = c.size();
  Kokkos::View<float*, Kokkos::LayoutRight, Host::memory_space> a("a", 6), b("b", 5);
  const std::string where = " (communicator rank " + std::to_string(c.rank()) + " of " + std::to_string(n) + ")";
  CHECK_THROWS_WITH(
      pmt::comm::all_reduce(c, exec, a, b),
      StartsWith("pmt::comm::all_reduce: send is (6) but recv is (5); expected the same number of elements" + where));
  CHECK_THROWS_WITH(pmt::comm::broadcast(c, exec, a, n + 2),
                    StartsWith("pmt::comm::broadcast: root is " + std::to_string(n + 2) + "; expected a rank in [0, " +
                               std::to_string(n) + ")" + where));
  CHECK_THROWS_AS(pmt::comm::send(c, exec, a, -1), pmt::ConfigError);
  Kokkos::View<int*, Kokkos::LayoutRight, Host::memory_space> ints("ints", 3);
  CHECK_THROWS_WITH(pmt::comm::all_reduce(c, exec, ints, ReduceOp::Avg),
                    StartsWith("pmt::comm::all_reduce: ReduceOp::Avg needs a floating-point element type"));
  Kokkos::View<float*, Kokkos::LayoutRight, Host::memory_space> big("big", 6 * n + 1);
  CHECK_THROWS_AS(pmt::comm::all_gather(c, exec, a, big), pmt::ShapeError);
  CHECK_THROWS_AS(pmt::comm::reduce_scatter(c, exec, big, a), pmt::ShapeError);
  Kokkos::View<float**, Kokkos::LayoutRight, Host::memory_space> m("m", 4, 4);
  auto block = Kokkos::subview(m, std::make_pair(0, 2), std::make_pair(0, 2));  // LayoutRight, row stride 4
  CHECK_THROWS_WITH(
      pmt::comm::all_reduce(c, exec, block),
      StartsWith("pmt::comm::all_reduce: send is (2, 2) but not contiguous; collectives need contiguous Views"));
}

TEST_CASE("debug mode raises on every rank when ranks call different collectives", "[comm][debug][mpi]") {
  const auto& w = pmt::test::world();
  auto c        = w.split(0, w.rank());  // a fresh communicator: its own collective counter
  c.set_debug(true);
  Host exec;
  const int r = c.rank(), n = c.size();
  Kokkos::View<double*, Kokkos::LayoutRight, Host::memory_space> four("four", 4), five("five", 5);
  pmt::comm::all_reduce(c, exec, four);  // matching calls pass through the check
  if (n == 1) {
    pmt::comm::broadcast(c, exec, four, 0);
    SUCCEED("one rank cannot disagree with itself");
    return;
  }
  bool threw = false;
  std::string what;
  try {
    if (r == 0)
      pmt::comm::all_reduce(c, exec, four);
    else
      pmt::comm::all_reduce(c, exec, five);
  } catch (const pmt::CommError& e) {
    threw = true;
    what  = e.what();
  }
  INFO(what);
  CHECK(pmt::test::all_ranks(threw));
  CHECK_THAT(what, StartsWith("pmt::comm::all_reduce: collective mismatch on a communicator of " + std::to_string(n) +
                              " ranks: rank 0 calls all_reduce(count 4, float64, sum) as collective #1; "
                              "rank 1 calls all_reduce(count 5, float64, sum) as collective #1"));
  // a different collective altogether: rank 0 broadcasts while the others all_reduce
  threw = false;
  try {
    if (r == 0)
      pmt::comm::broadcast(c, exec, four, 0);
    else
      pmt::comm::all_reduce(c, exec, four);
  } catch (const pmt::CommError& e) {
    threw = true;
    what  = e.what();
  }
  CHECK(pmt::test::all_ranks(threw));
  CHECK_THAT(what, ContainsSubstring("rank 0 calls broadcast(count 4, float64, root 0)"));
}

#if PMT_ENABLE_MPI
TEST_CASE("PMT_DEBUG_COLLECTIVES=1 in the environment turns debug mode on for new communicators",
          "[comm][debug][mpi]") {
  setenv("PMT_DEBUG_COLLECTIVES", "1", 1);
  pmt::comm::Communicator<pmt::comm::Mpi> on(MPI_COMM_WORLD);
  setenv("PMT_DEBUG_COLLECTIVES", "0", 1);
  pmt::comm::Communicator<pmt::comm::Mpi> off(MPI_COMM_WORLD);
  unsetenv("PMT_DEBUG_COLLECTIVES");
  CHECK(on.debug());
  CHECK(off.debug() == (PMT_DEBUG != 0));  // PMT_DEBUG builds have it on regardless
  CHECK(on.split(0, 0).debug());           // a split inherits the flag
}

TEST_CASE("MPI failures become CommErrors naming the op, the call, MPI's text and the rank", "[comm][errors][mpi]") {
  const auto& c = pmt::test::world();
  MPI_Errhandler eh;
  MPI_Comm_get_errhandler(c.native(), &eh);
  CHECK(eh == MPI_ERRORS_RETURN);
  MPI_Errhandler_free(&eh);
  CHECK_THROWS_WITH(pmt::detail::check_mpi(MPI_ERR_COUNT, "all_reduce", "MPI_Allreduce", 1, 4),
                    StartsWith("pmt::comm::Mpi::all_reduce: MPI_Allreduce failed: MPI_ERR_COUNT: invalid count "
                               "argument (communicator rank 1 of 4)"));
  // a real failing call, past the front end's checks: every rank passes the same invalid root
  Kokkos::View<float*, Kokkos::LayoutRight, Kokkos::HostSpace> buf("buf", 3);
  CHECK_THROWS_WITH(c.broadcast_raw(Host(), buf.data(), 3, pmt::comm::DataType::Float32, c.size() + 3),
                    StartsWith("pmt::comm::Mpi::broadcast: MPI_Bcast failed: MPI_ERR_ROOT"));
  CHECK(pmt::test::all_ranks(true));  // and the communicator still works afterwards
}
#endif

#if PMT_ENABLE_NCCL && PMT_ENABLE_MPI
TEST_CASE("Communicator<Nccl> without a usable CUDA device raises a clear CommError", "[comm][nccl][mpi]") {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0) SKIP("this machine has a CUDA device");
  CHECK_THROWS_WITH(pmt::comm::Communicator<pmt::comm::Nccl>(pmt::test::world()),
                    StartsWith("pmt::comm::Communicator<Nccl>: no CUDA device on rank " +
                               std::to_string(pmt::test::world().rank())) &&
                        ContainsSubstring("NCCL needs one GPU per rank"));
  CHECK_THROWS_WITH(pmt::detail::check_nccl(ncclInvalidArgument, "all_reduce", "ncclAllReduce"),
                    StartsWith("pmt::comm::Nccl::all_reduce: ncclAllReduce failed: invalid argument"));
}
#endif

TEST_CASE("Communicator<Self> refuses a recv that no send precedes instead of hanging", "[comm][self]") {
  pmt::comm::Communicator<pmt::comm::Self> self;
  Host exec;
  Kokkos::View<float*, Kokkos::LayoutRight, Host::memory_space> buf("buf", 3);
  CHECK_THROWS_WITH(pmt::comm::recv(self, exec, buf, 0, 5),
                    StartsWith("pmt::comm::Communicator<Self>::recv: no message with tag 5 was sent to this rank"));
  pmt::comm::send(self, exec, buf, 0, 5);
  Kokkos::View<float*, Kokkos::LayoutRight, Host::memory_space> wrong("wrong", 4);
  CHECK_THROWS_WITH(pmt::comm::recv(self, exec, wrong, 0, 5),
                    StartsWith("pmt::comm::Communicator<Self>::recv: the message with tag 5 has 12 bytes but the "
                               "receive buffer has 16"));
}

#if PMT_ENABLE_MPI
// Run by ctest with PMT_COMM_RULES=nccl on 2 ranks (comm_nccl_rules_np2): rank 0 sends 3 values
// tagged 1, then 5 tagged 2; rank 1 receives tag 2 first. MPI's tags match them crosswise; under
// NCCL's rules the first receive gets the first message, whose count differs: a pmt::CommError
// naming both counts, and the next receive gets the second message.
TEST_CASE("NCCL's matching rules: tags ignored, a message of another count refused", "[.nccl_rules][mpi]") {
  const auto& c = pmt::test::world();
  REQUIRE(pmt::comm::nccl_matching_rules());
  REQUIRE(c.size() == 2);
  Host exec;
  Kokkos::View<double*, Kokkos::LayoutRight, Host::memory_space> three("three", 3), five("five", 5);
  if (c.rank() == 0) {
    Kokkos::deep_copy(three, 3.0);
    Kokkos::deep_copy(five, 5.0);
    auto a = pmt::comm::isend(c, exec, three, 1, /*tag=*/1);
    auto b = pmt::comm::isend(c, exec, five, 1, /*tag=*/2);
    a.wait();
    b.wait();
  } else {
    CHECK_THROWS_WITH(pmt::comm::recv(c, exec, five, 0, /*tag=*/2),
                      ContainsSubstring("a message of 3 elements from rank 0 matched a receive of 5 on rank 1 of 2") &&
                          ContainsSubstring("NCCL's rules"));
    pmt::comm::recv(c, exec, five, 0, /*tag=*/1);  // the tag is ignored: the second message, in order
    CHECK(five(4) == 5.0);
  }
}

// Run with PMT_COMM_RULES=nccl on 2 ranks (comm_nccl_rules_np2): NCCL's stream order. A send
// outside a group holds the stream until its receiver took it (rank 1 posts its receive 0.3 s
// late: rank 0's isend returns no earlier), where MPI's eager protocol would return at once.
TEST_CASE("NCCL's stream order: a send outside a group completes when its receiver took it", "[.nccl_rules][mpi]") {
  const auto& c = pmt::test::world();
  REQUIRE(pmt::comm::nccl_matching_rules());
  REQUIRE(c.size() == 2);
  Host exec;
  Kokkos::View<double*, Kokkos::LayoutRight, Host::memory_space> x("x", 2);
  pmt::comm::barrier(c);
  const auto t0 = std::chrono::steady_clock::now();
  if (c.rank() == 0) {
    Kokkos::deep_copy(x, 7.0);
    auto sq = pmt::comm::isend(c, exec, x, 1);
    CHECK(sq.test());  // completed where it was issued
    CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() >= 0.25);
  } else {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    pmt::comm::recv(c, exec, x, 0);
    CHECK(x(1) == 7.0);
  }
}
#endif

TEST_CASE("comm::group: a ring exchange posted as one group; a blocking operation inside one is refused",
          "[comm][mpi]") {
  const auto& c = pmt::test::world();
  Host exec;
  const int n = c.size(), r = c.rank();
  Kokkos::View<double*, Kokkos::LayoutRight, Host::memory_space> mine("mine", 4), theirs("theirs", 4);
  Kokkos::deep_copy(mine, static_cast<double>(r));
  pmt::comm::Request rq, sq;
  // receive first, then send: outside a group this waits forever under stream order (NCCL)
  pmt::comm::group(c, exec, [&] {
    rq = pmt::comm::irecv(c, exec, theirs, (r + n - 1) % n, /*tag=*/3);
    sq = pmt::comm::isend(c, exec, mine, (r + 1) % n, 3);
  });
  rq.wait();
  sq.wait();
  CHECK(theirs(3) == static_cast<double>((r + n - 1) % n));
  // refused on every rank alike, before any message
  CHECK_THROWS_WITH(
      pmt::comm::group(c, exec, [&] { pmt::comm::send(c, exec, mine, (r + 1) % n); }),
      ContainsSubstring("pmt::comm::send") && ContainsSubstring("a blocking operation inside a group (comm::group)"));
  // the group closed on the error: a later exchange runs
  pmt::comm::group(c, exec, [&] {
    rq = pmt::comm::irecv(c, exec, theirs, (r + 1) % n, 4);
    sq = pmt::comm::isend(c, exec, mine, (r + n - 1) % n, 4);
  });
  rq.wait();
  sq.wait();
  CHECK(theirs(0) == static_cast<double>((r + 1) % n));
}
