// SPDX-License-Identifier: Apache-2.0
// Built against the installed pmt by tests/CMakeLists.txt (install_consumer_builds_with_find_package).
#include <pmt/pmt.hpp>

#include <cstdio>
#include <string>

int main(int argc, char* argv[]) {
  pmt::ScopeGuard guard(argc, argv);
  std::printf("%s", pmt::environment_report().c_str());
  Kokkos::View<float**, Kokkos::LayoutRight> x("x", 3, 4);
  try {
    pmt::detail::require(x.extent(1) == 5, "pmt_consumer::check",
                         [&] { return "x is " + pmt::shape_str(x) + "; expected 5 columns"; });
  } catch (const pmt::ShapeError& e) {
    if (std::string(e.what()) == "pmt_consumer::check: x is (3, 4); expected 5 columns") {
      std::printf("pmt_consumer: ok (pmt %s)\n", pmt::version());
      return 0;
    }
    std::printf("pmt_consumer: unexpected message: %s\n", e.what());
  }
  return 1;
}
