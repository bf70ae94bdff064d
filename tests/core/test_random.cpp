// SPDX-License-Identifier: Apache-2.0
// pmt's counter-based generator (core/random.hpp) is Philox4x32-10 as Random123 defines it (Salmon
// et al., SC'11; Debian's librandom123-dev): for any counter and key the four words are those of
// r123::Philox4x32, and random_bits(key, index) is that generator at counter (index low word,
// index high word, stream, 0x706d74) and key (seed low word, seed high word). pmt keeps its own
// ten-line round function so that the library does not depend on Random123 (it runs in Kokkos
// kernels on every backend); this test holds the two to the same bits.
#include <catch2/catch_test_macros.hpp>

#include "pmt/core/random.hpp"

#include <Random123/philox.h>

#include <cstdint>

TEST_CASE("pmt's Philox4x32-10 is Random123's, word for word", "[core][random]") {
  r123::Philox4x32 reference;
  std::uint64_t mismatches = 0;
  std::uint32_t x          = 12345;
  const auto next          = [&x] { return x = x * 1664525u + 1013904223u; };  // any counters and keys
  for (int i = 0; i < 20000; ++i) {
    const r123::Philox4x32::ctr_type c = {{next(), next(), next(), next()}};
    const r123::Philox4x32::key_type k = {{next(), next()}};
    const auto want                    = reference(c, k);
    const auto got                     = pmt::detail::philox4x32_10(c[0], c[1], c[2], c[3], k[0], k[1]);
    for (int w = 0; w < 4; ++w) mismatches += got.v[w] != want[w];
  }
  CHECK(mismatches == 0);
}

TEST_CASE("random_bits(key, index) is Random123's Philox4x32 at pmt's counter and key", "[core][random]") {
  r123::Philox4x32 reference;
  std::uint64_t mismatches = 0;
  for (const std::uint64_t seed : {std::uint64_t(0), std::uint64_t(17), std::uint64_t(0x123456789abcdefULL)})
    for (const std::uint32_t stream : {0u, 3u, 0xffffffffu})
      for (std::uint64_t index :
           {std::uint64_t(0), std::uint64_t(1), std::uint64_t(1) << 32, std::uint64_t(0xfedcba9876543210ULL)}) {
        const pmt::RngKey key{seed, stream};
        const r123::Philox4x32::ctr_type c = {
            {static_cast<std::uint32_t>(index), static_cast<std::uint32_t>(index >> 32), stream, 0x706d74u}};
        const r123::Philox4x32::key_type k = {
            {static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)}};
        const auto want = reference(c, k);
        const auto got  = pmt::random_bits(key, index);
        for (int w = 0; w < 4; ++w) mismatches += got.v[w] != want[w];
      }
  CHECK(mismatches == 0);
}
