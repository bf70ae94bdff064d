// SPDX-License-Identifier: Apache-2.0
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include "pmt/core/environment.hpp"
#include "pmt/core/error.hpp"

#include <string>

using Catch::Matchers::ContainsSubstring;
using Catch::Matchers::Equals;

TEST_CASE("shape_str prints every extent of a View", "[core][error]") {
  Kokkos::View<float**, Kokkos::LayoutRight, Kokkos::HostSpace> a("a", 32, 768);
  Kokkos::View<double*, Kokkos::HostSpace> b("b", 5);
  Kokkos::View<int, Kokkos::HostSpace> c("c");
  CHECK(pmt::shape_str(a) == "(32, 768)");
  CHECK(pmt::shape_str(b) == "(5)");
  CHECK(pmt::shape_str(c) == "()");
}

TEST_CASE("require builds its message only when the check fails", "[core][error]") {
  int calls    = 0;
  auto message = [&] {
    ++calls;
    return std::string("A is (64, 128) but B is (256, 32); A.cols must equal B.rows");
  };
  pmt::detail::require(true, "pmt::ops::matmul", message);
  CHECK(calls == 0);
  CHECK_THROWS_AS(pmt::detail::require(false, "pmt::ops::matmul", message), pmt::ShapeError);
  CHECK(calls == 1);
}

TEST_CASE("errors name the op, the values and the rank context", "[core][error]") {
  try {
    pmt::detail::require<pmt::ConfigError>(false, "pmt::Mesh",
                                           [] { return std::string("dp(2) * tp(2) * pp(2) = 8 != world size 6"); });
    FAIL("require did not throw");
  } catch (const pmt::Error& e) {
    const std::string expected_rank = pmt::world_size() > 1 ? " [rank " + std::to_string(pmt::world_rank()) + "/" +
                                                                  std::to_string(pmt::world_size()) + "]"
                                                            : "";
    CHECK_THAT(e.what(), Equals("pmt::Mesh: dp(2) * tp(2) * pp(2) = 8 != world size 6" + expected_rank));
    CHECK(e.op() == "pmt::Mesh");
  }
}

TEST_CASE("ErrorContext tags nest and unwind", "[core][error]") {
  pmt::ErrorContext outer("pp stage 1");
  {
    pmt::ErrorContext inner("tp rank 0/2");
    CHECK_THAT(pmt::detail::context_suffix(), ContainsSubstring("pp stage 1, tp rank 0/2]"));
  }
  CHECK_THAT(pmt::detail::context_suffix(), ContainsSubstring("pp stage 1]"));
  CHECK_THAT(pmt::detail::context_suffix(), !ContainsSubstring("tp rank"));
}

TEST_CASE("every pmt error derives from pmt::Error and std::exception", "[core][error]") {
  CHECK_THROWS_AS(throw pmt::ShapeError("op", "x"), pmt::Error);
  CHECK_THROWS_AS(throw pmt::ConfigError("op", "x"), pmt::Error);
  CHECK_THROWS_AS(throw pmt::CommError("op", "x"), std::runtime_error);
  CHECK_THROWS_AS(throw pmt::IoError("op", "x"), std::exception);
}
