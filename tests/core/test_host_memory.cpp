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
  // A step's worth of buffers: four blocks of 16 MiB (4096 pages of 4 KiB each) allocated,
  // touched and freed together, ten rounds at a time, first with the C library's default, then
  // kept. By default every round faults all of them in again (once that much is free at the top
  // of the heap, glibc trims it). Kept, the heap stops shrinking and the blocks are reused. The
  // kept rounds come second, on the heap the default rounds grew: measured alone in a process
  // that had run other tests, the kept rounds of Kokkos 5.2 with glibc 2.43 still put up to three
  // blocks on fresh pages in ten rounds while the heap settled around Kokkos' small allocation
  // records (Kokkos 3.4 with Debian 12's glibc: none). In this order both measure 163 520 faults
  // by default and 0 kept. Three warm-up rounds each, as a training loop's first steps.
  constexpr std::size_t n = (16u << 20) / sizeof(float);
  using V = Kokkos::View<float*, Kokkos::HostSpace>;
  auto round = [&] {
    float s = 0;
    std::vector<V> blocks;
    blocks.reserve(4);
    for (int b = 0; b < 4; ++b) {
      blocks.emplace_back(Kokkos::view_alloc(Kokkos::WithoutInitializing, "pmt::test::block"), n);
      for (std::size_t i = 0; i < n; i += 1024) blocks.back()(i) = 1.0f;
      s += blocks.back()(0);
    }
    return s;
  };
  auto ten_rounds = [&](float& s) {
    for (int warm_up = 0; warm_up < 3; ++warm_up) round();
    const long before = pmt::minor_page_faults();
    for (int r = 0; r < 10; ++r) s += round();
    return pmt::minor_page_faults() - before;
  };
  REQUIRE_FALSE(pmt::freed_host_memory_kept());  // nothing in this binary kept it before
  float s = 0;
  const long by_default = ten_rounds(s);
  REQUIRE(pmt::keep_freed_host_memory());
  CHECK(pmt::freed_host_memory_kept());
  const long kept = ten_rounds(s);
  CHECK(s == 80.0f);
  INFO("page faults in 10 rounds of 4 x 4096 pages: " << by_default << " by default, " << kept
                                                       << " kept");
  CHECK(by_default > 10 * 4096);  // the default really does fault the blocks in again
  CHECK(kept < 4096);             // kept: not one block's worth in ten rounds
#else
  CHECK_FALSE(pmt::keep_freed_host_memory());
#endif
}
