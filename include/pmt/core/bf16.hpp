// SPDX-License-Identifier: Apache-2.0
#pragma once
// bf16: the bfloat16 storage type (the upper 16 bits of an IEEE float: 8 exponent bits, 7
// mantissa bits), with conversions from float that round to nearest, ties to even, and keep nan
// a (quiet) nan and +-inf infinite. pmt computes in float and stores or sends bf16: it has no
// arithmetic of its own. Usable in host and device code on every Kokkos version.

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <cstring>

namespace pmt {

/// \brief bfloat16 as 16 bits of storage (see the file comment): bf16(x) rounds a float to
/// nearest even, float(b) is exact. Trivial, so Kokkos Views of it are zero-filled bit patterns.
struct bf16 {
  std::uint16_t bits;

  bf16() = default;
  /// \brief The bf16 nearest to f (ties to even); nan stays nan, overflow rounds to +-inf.
  KOKKOS_INLINE_FUNCTION explicit bf16(float f) : bits(round(f)) {}
  KOKKOS_INLINE_FUNCTION explicit operator float() const {
    const std::uint32_t u = std::uint32_t(bits) << 16;
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
  }
  /// \brief The bits of the bf16 nearest to f.
  static KOKKOS_INLINE_FUNCTION std::uint16_t round(float f) {
    std::uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    if ((u & 0x7F800000u) == 0x7F800000u && (u & 0x007FFFFFu) != 0)  // nan: keep the sign, make it quiet
      return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
    u += 0x7FFFu + ((u >> 16) & 1u);  // round to nearest, ties to even (carries into the exponent)
    return static_cast<std::uint16_t>(u >> 16);
  }
};

static_assert(sizeof(bf16) == 2, "pmt::bf16 must be 16 bits");

}  // namespace pmt
