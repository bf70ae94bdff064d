// SPDX-License-Identifier: Apache-2.0
#pragma once
// The 16-lane order of the row-wise reductions and the prefetch of the next row, shared by the
// portable row kernels (rowwise.hpp) and the host SIMD back ends (host_avx2.hpp): a row is summed
// in `row_lanes` interleaved partial sums that are combined pairwise in a fixed order. The order
// depends only on the row length (deterministic), and SIMD registers can hold the lanes without
// reassociating anything, so every back end gives the same bits.

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>

namespace pmt::detail {

inline constexpr int row_lanes = 16;

/// acc[0] after adding the lanes pairwise: 8 + 8, 4 + 4, 2 + 2, 1 + 1.
template <class S, class T>
KOKKOS_INLINE_FUNCTION S combine_lanes(S (&acc)[row_lanes]) {
  for (int w = row_lanes / 2; w > 0; w /= 2)
    for (int l = 0; l < w; ++l) acc[l] += acc[l + w];
  return acc[0];
}

/// Software prefetch of the cache line at p (read, or write when `write`); nothing on a GPU.
/// The row-wise kernels fetch row r + 1 while they compute on row r (which sits in L1), so that
/// memory and arithmetic overlap instead of alternating.
template <bool write = false>
KOKKOS_INLINE_FUNCTION void prefetch_line(const void* p) {
#if !defined(__CUDA_ARCH__) && !defined(__HIP_DEVICE_COMPILE__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_prefetch(p, write ? 1 : 0, 3);
#else
  (void)p;
#endif
}

/// Prefetches the cache lines of row_lanes elements from row + j (nothing when row is null).
template <bool write = false, class T>
KOKKOS_INLINE_FUNCTION void prefetch_lanes(T* row, std::int64_t j) {
  if (row == nullptr) return;
  for (std::size_t b = 0; b < row_lanes * sizeof(T); b += 64)
    prefetch_line<write>(reinterpret_cast<const char*>(row + j) + b);
}

}  // namespace pmt::detail
