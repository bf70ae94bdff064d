// SPDX-License-Identifier: Apache-2.0
#include <catch2/catch_test_macros.hpp>

#include "pmt/core/host_memory.hpp"

#include <Kokkos_Core.hpp>

#include <vector>

TEST_CASE("keep_freed_host_memory: a block freed and allocated again is not faulted in again",
          "[core][memory]") {
#if defined(__SANITIZE_ADDRESS__)
  // AddressSanitizer replaces glibc's allocator, and with it mallopt: nothing can be kept, and
  // pmt must say so rather than claim it (scripts/check.sh builds the tests this way).
  CHECK_FALSE(pmt::keep_freed_host_memory());
  CHECK_FALSE(pmt::freed_host_memory_kept());
#elif defined(__GLIBC__)
  REQUIRE(pmt::keep_freed_host_memory());
  CHECK(pmt::freed_host_memory_kept());
  // A step's worth of buffers: four blocks of 16 MiB (4096 pages of 4 KiB each) allocated,
  // touched and freed together, ten times over. With the C library's default, every round faults
  // all of them in again (once that much is free at the top of the heap, glibc trims it); kept,
  // only the first round does.
  constexpr std::size_t n = (16u << 20) / sizeof(float);
  using V = Kokkos::View<float*, Kokkos::HostSpace>;
  auto round = [&] {
    float s = 0;
    std::vector<V> blocks;
    for (int b = 0; b < 4; ++b) {
      blocks.emplace_back(Kokkos::view_alloc(Kokkos::WithoutInitializing, "pmt::test::block"), n);
      for (std::size_t i = 0; i < n; i += 1024) blocks.back()(i) = 1.0f;
      s += blocks.back()(0);
    }
    return s;
  };
  round();
  const long before = pmt::minor_page_faults();
  float s = 0;
  for (int r = 0; r < 10; ++r) s += round();
  const long faults = pmt::minor_page_faults() - before;
  CHECK(s == 40.0f);
  INFO("page faults in 10 rounds of 4 x 4096 pages: " << faults);
  CHECK(faults < 4096);
#else
  CHECK_FALSE(pmt::keep_freed_host_memory());
#endif
}
