// SPDX-License-Identifier: Apache-2.0
#pragma once
// Counter-based random numbers (Philox-4x32-10, Salmon et al., SC'11) keyed by
// (seed, stream id, global element index): an element's value depends only on those keys, never
// on the thread count, the execution space or which rank holds it (design invariant 3). A shard
// fills itself with the values the whole tensor would hold at its global indices (GlobalSlice).

#include "pmt/core/error.hpp"
#include "pmt/core/step_context.hpp"  // RandomContext: the keys of layout-independent draws
#include "pmt/core/tensor.hpp"
#include "pmt/detail/kokkos_compat.hpp"

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdint>

namespace pmt::detail {

struct Philox4x32 {
  std::uint32_t v[4];
};

/// Philox-4x32 with 10 rounds on counter (c0..c3) and key (k0, k1).
KOKKOS_INLINE_FUNCTION Philox4x32 philox4x32_10(std::uint32_t c0, std::uint32_t c1, std::uint32_t c2, std::uint32_t c3,
                                                std::uint32_t k0, std::uint32_t k1) {
  constexpr std::uint64_t m0 = 0xD2511F53u, m1 = 0xCD9E8D57u;
  for (int round = 0; round < 10; ++round) {
    const std::uint64_t p0 = m0 * c0, p1 = m1 * c2;
    const std::uint32_t hi0 = static_cast<std::uint32_t>(p0 >> 32), lo0 = static_cast<std::uint32_t>(p0);
    const std::uint32_t hi1 = static_cast<std::uint32_t>(p1 >> 32), lo1 = static_cast<std::uint32_t>(p1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return Philox4x32{{c0, c1, c2, c3}};
}

}  // namespace pmt::detail

namespace pmt {

// ---------------------------------------------------------------------------------------------

/// \brief The key of a random stream: a seed and a stream id (e.g. a parameter's id).
struct RngKey {
  std::uint64_t seed   = 0;
  std::uint32_t stream = 0;
};

/// \brief Four random 32-bit words for element `index` of stream `key`.
KOKKOS_INLINE_FUNCTION detail::Philox4x32 random_bits(const RngKey& key, std::uint64_t index) {
  return detail::philox4x32_10(static_cast<std::uint32_t>(index), static_cast<std::uint32_t>(index >> 32), key.stream,
                               0x706d74u, static_cast<std::uint32_t>(key.seed),
                               static_cast<std::uint32_t>(key.seed >> 32));
}

/// \brief Uniform in the open interval (0, 1), 53 random bits, for element `index`.
KOKKOS_INLINE_FUNCTION double random_uniform(const RngKey& key, std::uint64_t index) {
  const detail::Philox4x32 r = random_bits(key, index);
  const std::uint64_t bits   = (static_cast<std::uint64_t>(r.v[0]) << 21) ^ (r.v[1] >> 11);
  return (static_cast<double>(bits & ((std::uint64_t(1) << 53) - 1)) + 0.5) * 0x1.0p-53;
}

/// \brief Standard normal (Box-Muller on two independent 53-bit uniforms) for element `index`.
KOKKOS_INLINE_FUNCTION double random_normal(const RngKey& key, std::uint64_t index) {
  const detail::Philox4x32 r = random_bits(key, index);
  const std::uint64_t b1     = (static_cast<std::uint64_t>(r.v[0]) << 21) ^ (r.v[1] >> 11);
  const std::uint64_t b2     = (static_cast<std::uint64_t>(r.v[2]) << 21) ^ (r.v[3] >> 11);
  const std::uint64_t mask   = (std::uint64_t(1) << 53) - 1;
  const double u1            = (static_cast<double>(b1 & mask) + 0.5) * 0x1.0p-53;
  const double u2            = (static_cast<double>(b2 & mask) + 0.5) * 0x1.0p-53;
  return detail::math::sqrt(-2.0 * detail::math::log(u1)) * detail::math::cos(6.283185307179586 * u2);
}

/// \brief Where a local tensor sits in the global one: global extents and the offset of the
/// local block along each dim. The default (all zero) means "the local tensor is the whole one".
struct GlobalSlice {
  static constexpr int max_rank  = 4;
  std::uint64_t extent[max_rank] = {0, 0, 0, 0};
  std::uint64_t offset[max_rank] = {0, 0, 0, 0};
};

namespace detail {

enum class Distribution { Uniform, Normal };

template <class Exec, class View>
void fill_random(const Exec& exec, const View& v, const RngKey& key, GlobalSlice slice, Distribution dist, double a,
                 double b, const char* op) {
  static_check_view<Exec, View>();
  constexpr int R = static_cast<int>(View::rank);
  static_assert(R >= 1 && R <= GlobalSlice::max_rank, "pmt::fill_*: tensors of rank 1 to 4");
  // Default slice: the local tensor is the global one.
  std::uint64_t local[GlobalSlice::max_rank] = {1, 1, 1, 1};
  for (int d = 0; d < R; ++d) {
    local[d] = v.extent(static_cast<std::size_t>(d));
    if (slice.extent[d] == 0) slice.extent[d] = local[d];
    require(slice.offset[d] + local[d] <= slice.extent[d], op, [&] {
      return str("the local tensor ", shape_str(v), " does not fit in the global slice along dim ", d, ": offset ",
                 slice.offset[d], " + ", local[d], " > ", slice.extent[d]);
    });
  }
  using T      = typename View::value_type;
  auto data    = flat(v);
  const auto n = static_cast<std::int64_t>(v.size());
  Kokkos::parallel_for(
      op, Kokkos::RangePolicy<Exec>(exec, 0, n), KOKKOS_LAMBDA(std::int64_t l) {
        // local flat index -> local multi-index -> global linear index
        std::uint64_t rest = static_cast<std::uint64_t>(l), global = 0, stride = 1;
        for (int d = R - 1; d >= 0; --d) {
          const std::uint64_t i = rest % local[d];
          rest /= local[d];
          global += (slice.offset[d] + i) * stride;
          stride *= slice.extent[d];
        }
        const double x = dist == Distribution::Normal ? a + b * random_normal(key, global)
                                                      : a + (b - a) * random_uniform(key, global);
        data(l)        = static_cast<T>(x);
      });
}

}  // namespace detail

/// \brief Fills `v` with N(mean, stddev^2) values keyed by (key, global index).
/// \throws pmt::ShapeError when `v` does not fit in `slice`.
template <class Exec, class View>
void fill_normal(const Exec& exec, const View& v, const RngKey& key, double mean, double stddev,
                 const GlobalSlice& slice = {}) {
  detail::fill_random(exec, v, key, slice, detail::Distribution::Normal, mean, stddev, "pmt::fill_normal");
}

/// \brief Fills `v` with U(lo, hi) values keyed by (key, global index).
/// \throws pmt::ShapeError when `v` does not fit in `slice`.
template <class Exec, class View>
void fill_uniform(const Exec& exec, const View& v, const RngKey& key, double lo, double hi,
                  const GlobalSlice& slice = {}) {
  detail::fill_random(exec, v, key, slice, detail::Distribution::Uniform, lo, hi, "pmt::fill_uniform");
}

}  // namespace pmt
