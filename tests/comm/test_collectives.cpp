// SPDX-License-Identifier: Apache-2.0
// Every collective, in place and out of place, float and double, sizes 0, 1, 13 (prime) and 2^20
// (on 3 ranks or more the MPI backend's reduce-scatter takes its ring at that size),
// on values whose sums are exact, so results compare bitwise (the nccl-tests method). Runs on
// the MPI world (np = 1, 2, 4) and on Communicator<Self>.
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include "comm_test.hpp"
#include "pmt/core/bf16.hpp"

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

using pmt::comm::ReduceOp;
using Host = Kokkos::DefaultHostExecutionSpace;

namespace {

template <class T>
using Vec = Kokkos::View<T*, Kokkos::LayoutRight, Host::memory_space>;

template <class T, class C>
bool check_all_reduce(const C& c, std::size_t n) {
  Host exec;
  const int r = c.rank(), p = c.size();
  bool ok = true;
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min})
    for (bool in_place : {false, true}) {
      Vec<T> send("send", n), recv("recv", n);
      for (std::size_t i = 0; i < n; ++i) send(i) = T(r + 1) + T(i % 5);
      if (in_place) {
        pmt::comm::all_reduce(c, exec, send, op);
        recv = send;
      } else {
        pmt::comm::all_reduce(c, exec, send, recv, op);
      }
      exec.fence();
      for (std::size_t i = 0; i < n; ++i) {
        const T sum = T(p * (p + 1) / 2) + T(p) * T(i % 5);
        T expect    = sum;
        if (op == ReduceOp::Avg) expect = p > 1 ? sum * (T(1) / T(p)) : sum;
        if (op == ReduceOp::Max) expect = T(p) + T(i % 5);
        if (op == ReduceOp::Min) expect = T(1) + T(i % 5);
        ok = ok && recv(i) == expect;
      }
    }
  return ok;
}

template <class T, class C>
bool check_reduce_scatter_all_gather_broadcast(const C& c, std::size_t m) {
  Host exec;
  const int r = c.rank(), p = c.size();
  const std::size_t n = m * static_cast<std::size_t>(p);
  bool ok             = true;
  for (bool in_place : {false, true}) {
    // reduce_scatter: rank r gets the sum over ranks of block r
    Vec<T> send("send", n), out("out", m);
    for (std::size_t i = 0; i < n; ++i) send(i) = T(r + 1) + T(i % 5);
    auto recv = in_place ? Kokkos::subview(send, std::make_pair(static_cast<std::size_t>(r) * m, (r + 1) * m))
                         : Kokkos::subview(out, std::make_pair(std::size_t(0), m));
    pmt::comm::reduce_scatter(c, exec, send, recv, ReduceOp::Sum);
    exec.fence();
    for (std::size_t j = 0; j < m; ++j)
      ok = ok && recv(j) == T(p * (p + 1) / 2) + T(p) * T((static_cast<std::size_t>(r) * m + j) % 5);
    if (!in_place) {  // the mean: the sum over the ranks (on the MPI backend's ring from 3 ranks and 1 MiB)
      for (std::size_t i = 0; i < n; ++i) send(i) = T(r + 1) + T(i % 5);
      pmt::comm::reduce_scatter(c, exec, send, recv, ReduceOp::Avg);
      exec.fence();
      for (std::size_t j = 0; j < m; ++j) {
        const double want = (p * (p + 1) / 2 + double(p) * double((static_cast<std::size_t>(r) * m + j) % 5)) / p;
        ok                = ok && std::abs(double(recv(j)) - want) <= 1e-6 * want;
      }
    }
    // all_gather: block b holds rank b's values
    Vec<T> mine("mine", m), all("all", n);
    auto src = in_place ? Kokkos::subview(all, std::make_pair(static_cast<std::size_t>(r) * m, (r + 1) * m))
                        : Kokkos::subview(mine, std::make_pair(std::size_t(0), m));
    for (std::size_t j = 0; j < m; ++j) src(j) = T(100 * (r + 1)) + T(j % 7);
    pmt::comm::all_gather(c, exec, src, all);
    exec.fence();
    for (std::size_t i = 0; i < n; ++i)
      ok = ok && all(i) == T(100 * (i / (m > 0 ? m : 1) + 1)) + T(i % (m > 0 ? m : 1) % 7);
  }
  // broadcast from the last rank
  Vec<T> buf("buf", m);
  for (std::size_t j = 0; j < m; ++j) buf(j) = T(r) + T(j % 3);
  pmt::comm::broadcast(c, exec, buf, p - 1);
  exec.fence();
  for (std::size_t j = 0; j < m; ++j) ok = ok && buf(j) == T(p - 1) + T(j % 3);
  return ok;
}

template <class T, class C>
bool check_send_recv(const C& c, std::size_t m) {
  Host exec;
  const int r = c.rank(), p = c.size();
  const int next = (r + 1) % p, prev = (r + p - 1) % p;
  Vec<T> out("out", m), in("in", m);
  for (std::size_t j = 0; j < m; ++j) out(j) = T(r * 1000) + T(j % 11);
  // blocking ring without deadlock: even ranks send first. On one rank a blocking send to itself
  // waits for a receive (MPI's rendezvous for large messages), so the receive is posted first.
  if (p == 1) {
    pmt::comm::Request pending, sent;
    pmt::comm::group(c, exec, [&] {
      pending = pmt::comm::irecv(c, exec, in, prev, 7);
      sent    = pmt::comm::isend(c, exec, out, next, 7);
    });
    pending.wait();
    sent.wait();
  } else if (r % 2 == 0) {
    pmt::comm::send(c, exec, out, next, 7);
    pmt::comm::recv(c, exec, in, prev, 7);
  } else {
    pmt::comm::recv(c, exec, in, prev, 7);
    pmt::comm::send(c, exec, out, next, 7);
  }
  bool ok = true;
  for (std::size_t j = 0; j < m; ++j) ok = ok && in(j) == T(prev * 1000) + T(j % 11);
  // non-blocking ring, polled with test(): one group (a receive issued alone first would hold a
  // stream-ordered rank, NCCL's, before its send)
  Vec<T> in2("in2", m);
  pmt::comm::Request rr, rs;
  pmt::comm::group(c, exec, [&] {
    rr = pmt::comm::irecv(c, exec, in2, prev, 8);
    rs = pmt::comm::isend(c, exec, out, next, 8);
  });
  while (!rr.test()) {
  }
  rs.wait();
  for (std::size_t j = 0; j < m; ++j) ok = ok && in2(j) == T(prev * 1000) + T(j % 11);
  return ok;
}

const std::vector<std::size_t> sizes = {0, 1, 13, std::size_t(1) << 20};

}  // namespace

TEMPLATE_TEST_CASE("all_reduce gives exact sum, avg, max and min in place and out of place", "[comm][collectives][mpi]",
                   float, double) {
  for (std::size_t n : sizes) {
    INFO("n = " << n);
    CHECK(pmt::test::all_ranks(check_all_reduce<TestType>(pmt::test::world(), n)));
    CHECK(check_all_reduce<TestType>(pmt::comm::Communicator<pmt::comm::Self>(), n));
  }
}

TEMPLATE_TEST_CASE("reduce_scatter, all_gather and broadcast are exact in place and out of place",
                   "[comm][collectives][mpi]", float, double) {
  for (std::size_t m : sizes) {
    INFO("block = " << m);
    CHECK(pmt::test::all_ranks(check_reduce_scatter_all_gather_broadcast<TestType>(pmt::test::world(), m)));
    CHECK(check_reduce_scatter_all_gather_broadcast<TestType>(pmt::comm::Communicator<pmt::comm::Self>(), m));
  }
}

TEMPLATE_TEST_CASE("send and recv, blocking and non-blocking, pass messages around a ring", "[comm][p2p][mpi]", float,
                   double) {
  for (std::size_t m : sizes) {
    INFO("message = " << m);
    CHECK(pmt::test::all_ranks(check_send_recv<TestType>(pmt::test::world(), m)));
    CHECK(check_send_recv<TestType>(pmt::comm::Communicator<pmt::comm::Self>(), m));
  }
}

TEST_CASE("iall_reduce overlapping a Kokkos kernel gives the same result and keeps its Views alive",
          "[comm][nonblocking][mpi]") {
  const auto& c = pmt::test::world();
  Host exec;
  const std::size_t n = std::size_t(1) << 20;
  Vec<double> buf("buf", n), other("other", n), ref("ref", n);
  for (std::size_t i = 0; i < n; ++i) ref(i) = buf(i) = double(c.rank() + 1) * 0.5 + double(i % 9);
  pmt::comm::all_reduce(c, exec, ref, ReduceOp::Avg);
  auto req        = pmt::comm::iall_reduce(c, exec, buf, ReduceOp::Avg);
  const long held = buf.use_count();
  Kokkos::parallel_for(
      "overlap", Kokkos::RangePolicy<Host>(exec, 0, n), KOKKOS_LAMBDA(std::size_t i) { other(i) = 2.0 * double(i); });
  exec.fence();
  req.wait();
  exec.fence();
  // the MPI request held a copy of the View until completion (Self completes at once)
  bool ok = (!PMT_ENABLE_MPI || held >= 2) && buf.use_count() == 1;
  for (std::size_t i = 0; i < n; ++i) ok = ok && buf(i) == ref(i) && other(i) == 2.0 * double(i);
  CHECK(pmt::test::all_ranks(ok));
}

TEST_CASE("ireduce_scatter equals reduce_scatter, two in flight at once, and refuses Avg and a bad shape",
          "[comm][nonblocking][mpi]") {
  const auto& c = pmt::test::world();
  Host exec;
  const auto n            = static_cast<std::size_t>(c.size());
  const std::size_t block = 1000;
  Vec<double> a("a", block * n), b("b", block * n), ra("ra", block), rb("rb", block), ea("ea", block), eb("eb", block);
  for (std::size_t i = 0; i < a.size(); ++i)
    a(i) = double(c.rank() + 1) * 0.25 + double(i % 13), b(i) = -double(i % 7) * (c.rank() + 2);
  pmt::comm::reduce_scatter(c, exec, a, ea);
  pmt::comm::reduce_scatter(c, exec, b, eb, ReduceOp::Max);
  auto qa = pmt::comm::ireduce_scatter(c, exec, a, ra);
  auto qb = pmt::comm::ireduce_scatter(c, exec, b, rb, ReduceOp::Max);
  qb.wait();  // completed out of order
  qa.wait();
  bool ok = true;
  for (std::size_t i = 0; i < block; ++i) ok = ok && ra(i) == ea(i) && rb(i) == eb(i);
  CHECK(pmt::test::all_ranks(ok));
  CHECK_THROWS_WITH((void)pmt::comm::ireduce_scatter(c, exec, a, ra, ReduceOp::Avg),
                    Catch::Matchers::ContainsSubstring("Avg"));
  Vec<double> wrong("wrong", block + 1);
  CHECK_THROWS_WITH((void)pmt::comm::ireduce_scatter(c, exec, a, wrong),
                    Catch::Matchers::ContainsSubstring("blocks of recv"));
}

TEST_CASE("iall_gather equals all_gather, two in flight at once, and refuses a bad shape", "[comm][nonblocking][mpi]") {
  const auto& c = pmt::test::world();
  Host exec;
  const auto n            = static_cast<std::size_t>(c.size());
  const std::size_t block = 777;
  Vec<double> a("a", block), b("b", 3), ra("ra", block * n), rb("rb", 3 * n), ea("ea", block * n), eb("eb", 3 * n);
  for (std::size_t i = 0; i < block; ++i) a(i) = double(c.rank() + 1) * 0.5 + double(i % 11);
  for (std::size_t i = 0; i < 3; ++i) b(i) = -double(c.rank() * 10 + int(i));
  pmt::comm::all_gather(c, exec, a, ea);
  pmt::comm::all_gather(c, exec, b, eb);
  auto qa = pmt::comm::iall_gather(c, exec, a, ra);
  auto qb = pmt::comm::iall_gather(c, exec, b, rb);
  qb.wait();  // completed out of order
  qa.wait();
  bool ok = true;
  for (std::size_t i = 0; i < ra.size(); ++i) ok = ok && ra(i) == ea(i);
  for (std::size_t r = 0; r < n; ++r)
    for (std::size_t i = 0; i < 3; ++i)
      ok = ok && rb(r * 3 + i) == -double(r * 10 + i) && eb(r * 3 + i) == rb(r * 3 + i);
  CHECK(pmt::test::all_ranks(ok));
  Vec<double> wrong("wrong", block * n + 1);
  CHECK_THROWS_WITH((void)pmt::comm::iall_gather(c, exec, a, wrong),
                    Catch::Matchers::ContainsSubstring("blocks of send"));
}

TEST_CASE("bf16 rounds to nearest even, keeps nan and inf, and moves through the collectives", "[comm][bf16][mpi]") {
  // conversions: exact values stay, ties go to the even neighbour, overflow becomes inf
  const auto bits = [](float f) { return pmt::bf16(f).bits; };
  CHECK(bits(1.0f) == 0x3F80);
  CHECK(bits(-2.5f) == 0xC020);
  CHECK(static_cast<float>(pmt::bf16(3.140625f)) == 3.140625f);  // 8 significant bits: exact
  CHECK(bits(1.0f + 1.0f / 256) == 0x3F80);                      // halfway, even below
  CHECK(bits(1.0f + 3.0f / 256) == 0x3F82);                      // halfway, even above
  CHECK(bits(1.0f + 1.0f / 256 + 1.0f / 65536) == 0x3F81);       // just above halfway
  CHECK(bits(std::numeric_limits<float>::infinity()) == 0x7F80);
  CHECK(bits(std::numeric_limits<float>::max()) == 0x7F80);  // rounds past the largest bf16
  CHECK(std::isnan(static_cast<float>(pmt::bf16(std::numeric_limits<float>::quiet_NaN()))));
  CHECK(std::isnan(static_cast<float>(pmt::bf16(-std::numeric_limits<float>::signaling_NaN()))));
  // all_reduce (sum, max, min; in place and out of place) and all_gather of bf16: values whose
  // sums are exact in bf16, so results compare bitwise
  const auto run = [](const auto& c) {
    Host exec;
    const int r = c.rank(), p = c.size();
    bool ok = true;
    for (std::size_t n : {std::size_t(0), std::size_t(13), std::size_t(1) << 16})
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min})
        for (bool in_place : {false, true}) {
          Vec<pmt::bf16> send("send", n), recv("recv", n);
          for (std::size_t i = 0; i < n; ++i) send(i) = pmt::bf16(float(r + 1) + float(i % 5));
          if (in_place)
            pmt::comm::all_reduce(c, exec, send, op), recv = send;
          else
            pmt::comm::all_reduce(c, exec, send, recv, op);
          exec.fence();
          for (std::size_t i = 0; i < n; ++i) {
            const float k      = float(i % 5);
            const float expect = op == ReduceOp::Sum   ? float(p * (p + 1) / 2) + float(p) * k
                                 : op == ReduceOp::Max ? float(p) + k
                                                       : 1.0f + k;
            ok                 = ok && static_cast<float>(recv(i)) == expect;
          }
        }
    Vec<pmt::bf16> mine("mine", 3), all("all", 3 * std::size_t(p));
    for (std::size_t i = 0; i < 3; ++i) mine(i) = pmt::bf16(float(10 * r) + float(i));
    pmt::comm::all_gather(c, exec, mine, all);
    exec.fence();
    for (int q = 0; q < p; ++q)
      for (std::size_t i = 0; i < 3; ++i)
        ok = ok && static_cast<float>(all(3 * std::size_t(q) + i)) == float(10 * q) + float(i);
    return ok;
  };
  CHECK(pmt::test::all_ranks(run(pmt::test::world())));
  CHECK(run(pmt::comm::Communicator<pmt::comm::Self>()));
}
