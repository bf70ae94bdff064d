// SPDX-License-Identifier: Apache-2.0
#pragma once
// Deterministic reductions: sum, mean, max, squared L2 norm of a whole tensor, and column sums of a
// matrix (bias gradients). Results are written to Views (no hidden fence); *_value() variants
// fence and return the number on the host.
//
// Determinism: a tensor is cut into fixed chunks (reduce_chunk elements, or row_chunk rows),
// each chunk is summed in reduce_lanes interleaved partials combined pairwise (a fixed order
// that vectorises), then the chunk partials are summed in order by one
// thread. The order depends only on the sizes, never on the thread count or the space.
// Sums accumulate in double (float inputs too).

#include "pmt/core/error.hpp"
#include "pmt/core/tensor.hpp"
#include "pmt/core/workspace.hpp"

#include <Kokkos_Core.hpp>

#include <cstdint>

namespace pmt::detail {

inline constexpr std::int64_t reduce_chunk = 4096;  // elements per partial
inline constexpr std::int64_t row_chunk    = 32;    // rows per partial in column sums
inline constexpr int reduce_lanes          = 16;    // interleaved partial sums within a chunk

enum class ReduceKind { Sum, SumSquares, Max };

/// The reduction of x(lo) .. x(hi - 1) (lo < hi) as one chunk partial: reduce_lanes interleaved
/// partials (element i goes to lane (i - lo) % reduce_lanes), combined pairwise: a fixed order
/// that the compiler maps onto SIMD registers (one running sum would be a chain of dependent
/// additions, a few cycles per element). `x(i)` is any indexable: a View or a pointer.
/// chunked_reduce and the multi-tensor norms (ops/multi_tensor.hpp) both use it.
template <ReduceKind kind, class X>
KOKKOS_INLINE_FUNCTION double reduce_span(const X& x, std::int64_t lo, std::int64_t hi) {
  double acc[reduce_lanes];
  for (int l = 0; l < reduce_lanes; ++l) acc[l] = kind == ReduceKind::Max ? static_cast<double>(x[lo]) : 0.0;
  std::int64_t i = lo;
  for (; i + reduce_lanes <= hi; i += reduce_lanes)
    for (int l = 0; l < reduce_lanes; ++l) {
      const double v = static_cast<double>(x[i + l]);
      if (kind == ReduceKind::Sum) acc[l] += v;
      if (kind == ReduceKind::SumSquares) acc[l] += v * v;
      if (kind == ReduceKind::Max) acc[l] = v > acc[l] ? v : acc[l];
    }
  for (int l = 0; i + l < hi; ++l) {
    const double v = static_cast<double>(x[i + l]);
    if (kind == ReduceKind::Sum) acc[l] += v;
    if (kind == ReduceKind::SumSquares) acc[l] += v * v;
    if (kind == ReduceKind::Max) acc[l] = v > acc[l] ? v : acc[l];
  }
  for (int w = reduce_lanes / 2; w > 0; w /= 2)
    for (int l = 0; l < w; ++l)
      acc[l] = kind == ReduceKind::Max ? (acc[l + w] > acc[l] ? acc[l + w] : acc[l]) : acc[l] + acc[l + w];
  return acc[0];
}

/// out() = reduction of the flat tensor x, computed in fixed chunks (see file comment).
template <ReduceKind kind, class Exec, class XV, class OV>
void chunked_reduce(const Exec& exec, const XV& x, const OV& out, double post_scale, const char* label) {
  static_check_view<Exec, XV>();
  static_check_view<Exec, OV>();
  static_assert(OV::rank == 0, "pmt::ops: reduction results are rank-0 Views");
  using R          = typename OV::non_const_value_type;
  auto fx          = flat(x);
  const auto n     = static_cast<std::int64_t>(fx.extent(0));
  const auto parts = (n + reduce_chunk - 1) / reduce_chunk;
  auto partial     = workspace_view<Kokkos::View<double*, Kokkos::LayoutRight, typename Exec::memory_space>>(
      "pmt::ops::reduce::partial", static_cast<std::size_t>(parts));
  Kokkos::parallel_for(
      label, Kokkos::RangePolicy<Exec>(exec, 0, parts), KOKKOS_LAMBDA(std::int64_t c) {
        const std::int64_t lo = c * reduce_chunk, hi = lo + reduce_chunk < n ? lo + reduce_chunk : n;
        partial(c) = reduce_span<kind>(fx, lo, hi);
      });
  Kokkos::parallel_for(
      label, Kokkos::RangePolicy<Exec>(exec, 0, 1), KOKKOS_LAMBDA(int) {
        double acc = kind == ReduceKind::Max ? (parts > 0 ? partial(0) : -infinity<double>()) : 0.0;
        for (std::int64_t c = 0; c < parts; ++c) {
          if (kind == ReduceKind::Max)
            acc = partial(c) > acc ? partial(c) : acc;
          else
            acc += partial(c);
        }
        out() = static_cast<R>(acc * post_scale);
      });
}

template <class OV>
typename OV::non_const_value_type read_scalar(const OV& out) {
  typename OV::non_const_value_type v{};
  Kokkos::deep_copy(v, out);  // fences
  return v;
}

}  // namespace pmt::detail

namespace pmt::ops {

/// \brief out() = sum of all elements of x (deterministic order, double accumulation).
template <class Exec, class XV, class OV>
void sum(const Exec& exec, const XV& x, const OV& out) {
  detail::chunked_reduce<detail::ReduceKind::Sum>(exec, x, out, 1.0, "pmt::ops::sum");
}

/// \brief out() = mean of all elements of x. \throws pmt::ShapeError when x is empty.
template <class Exec, class XV, class OV>
void mean(const Exec& exec, const XV& x, const OV& out) {
  detail::require(x.size() > 0, "pmt::ops::mean",
                  [&] { return "x is " + shape_str(x) + "; expected at least one element"; });
  detail::chunked_reduce<detail::ReduceKind::Sum>(exec, x, out, 1.0 / static_cast<double>(x.size()), "pmt::ops::mean");
}

/// \brief out() = largest element of x. \throws pmt::ShapeError when x is empty.
template <class Exec, class XV, class OV>
void max(const Exec& exec, const XV& x, const OV& out) {
  detail::require(x.size() > 0, "pmt::ops::max",
                  [&] { return "x is " + shape_str(x) + "; expected at least one element"; });
  detail::chunked_reduce<detail::ReduceKind::Max>(exec, x, out, 1.0, "pmt::ops::max");
}

/// \brief out() = sum of squares of x (the squared L2 norm; clipping by global norm sums these).
template <class Exec, class XV, class OV>
void squared_norm(const Exec& exec, const XV& x, const OV& out) {
  detail::chunked_reduce<detail::ReduceKind::SumSquares>(exec, x, out, 1.0, "pmt::ops::squared_norm");
}

/// \brief Host-value forms: run the reduction, fence, return the number.
template <class Exec, class XV>
double sum_value(const Exec& exec, const XV& x) {
  auto out =
      workspace_view<Kokkos::View<double, Kokkos::LayoutRight, typename Exec::memory_space>>("pmt::ops::sum::out");
  sum(exec, x, out);
  return detail::read_scalar(out);
}
template <class Exec, class XV>
double squared_norm_value(const Exec& exec, const XV& x) {
  auto out = workspace_view<Kokkos::View<double, Kokkos::LayoutRight, typename Exec::memory_space>>(
      "pmt::ops::squared_norm::out");
  squared_norm(exec, x, out);
  return detail::read_scalar(out);
}

/// \brief out(c) = beta * out(c) + sum_r x(r, c): column sums of x (R, C) (bias gradients),
/// summed in fixed chunks of rows then over chunks in order: deterministic.
/// \throws pmt::ShapeError when out's extent is not x's column count.
template <class Exec, class XV, class OV>
void column_sum(const Exec& exec, const XV& x, const OV& out, typename OV::non_const_value_type beta) {
  static_check_view<Exec, XV>();
  static_check_view<Exec, OV>();
  static_assert(XV::rank == 2 && OV::rank == 1, "pmt::ops::column_sum: x is (R, C), out is (C)");
  detail::require(out.extent(0) == x.extent(1), "pmt::ops::column_sum", [&] {
    return detail::str("x is ", shape_str(x), " but out is ", shape_str(out), "; out must be (", x.extent(1), ")");
  });
  using T      = typename OV::non_const_value_type;
  const auto R = static_cast<std::int64_t>(x.extent(0));
  const auto C = static_cast<std::int64_t>(x.extent(1));
  if (C == 0) return;
  const auto parts = (R + detail::row_chunk - 1) / detail::row_chunk;
  auto partial     = workspace_view<Kokkos::View<T**, Kokkos::LayoutRight, typename Exec::memory_space>>(
      "pmt::ops::column_sum::partial", static_cast<std::size_t>(parts), static_cast<std::size_t>(C));
  Kokkos::parallel_for(
      "pmt::ops::column_sum", Kokkos::RangePolicy<Exec>(exec, 0, parts), KOKKOS_LAMBDA(std::int64_t p) {
        const std::int64_t lo = p * detail::row_chunk;
        const std::int64_t hi = lo + detail::row_chunk < R ? lo + detail::row_chunk : R;
        T* acc                = &partial(p, 0);
        for (std::int64_t c = 0; c < C; ++c) acc[c] = T(0);
        for (std::int64_t r = lo; r < hi; ++r) {
          const T* row = &x(r, 0);
          for (std::int64_t c = 0; c < C; ++c) acc[c] += row[c];
        }
      });
  Kokkos::parallel_for(
      "pmt::ops::column_sum", Kokkos::RangePolicy<Exec>(exec, 0, C), KOKKOS_LAMBDA(std::int64_t c) {
        T acc = T(0);
        for (std::int64_t p = 0; p < parts; ++p) acc += partial(p, c);
        out(c) = (beta == T(0) ? T(0) : beta * out(c)) + acc;
      });
}

}  // namespace pmt::ops
