// SPDX-License-Identifier: Apache-2.0
#pragma once
// Row-wise softmax and log-softmax with an optional causal mask, and their backward.
// Shapes: x, y are (rows, cols) or (batch, rows, cols); the softmax runs over the last dim.
// Causal: in each (rows, cols) matrix, row i sees columns j <= i + (cols - rows); masked entries
// of softmax are 0 and of log-softmax -inf; their gradients are 0.
// Host spaces: one thread per row, each row in index order: bitwise independent of the thread
// count. Device spaces: a row over a team thread's vector lanes (rowwise.hpp, "device-shaped rows").

#include "pmt/core/error.hpp"
#include "pmt/core/tensor.hpp"
#include "pmt/detail/kokkos_compat.hpp"
#include "pmt/ops/detail/rowwise.hpp"

#include <Kokkos_Core.hpp>

#include <cstdint>

namespace pmt::ops {

/// \brief Whether row i of a score matrix may see columns past i (None) or not (Causal).
enum class Mask { None, Causal };

}  // namespace pmt::ops

namespace pmt::detail {

/// (batch * rows, cols) geometry of a rank-2 or rank-3 View; `visible(r)` is the number of
/// columns row r sees.
struct RowGeometry {
  std::int64_t nrows, rows, cols;
  bool causal;
  KOKKOS_INLINE_FUNCTION std::int64_t visible(std::int64_t r) const {
    if (!causal) return cols;
    const std::int64_t v = r % rows + 1 + (cols - rows);
    return v < 0 ? 0 : (v > cols ? cols : v);
  }
};

template <class V>
RowGeometry row_geometry(const V& v, const char* name, ops::Mask mask, const char* op) {
  static_assert(V::rank == 2 || V::rank == 3, "pmt::ops: softmax takes (rows, cols) or (batch, rows, cols)");
  const std::int64_t cols  = static_cast<std::int64_t>(v.extent(V::rank - 1));
  const std::int64_t rows  = static_cast<std::int64_t>(v.extent(V::rank - 2));
  const std::int64_t nrows = static_cast<std::int64_t>(v.size()) / (cols > 0 ? cols : 1);
  require(mask == ops::Mask::None || rows <= cols, op,
          [&] { return str(name, " is ", shape_str(v), "; a causal mask needs rows <= cols"); });
  return RowGeometry{cols > 0 ? nrows : 0, rows, cols, mask == ops::Mask::Causal};
}

/// One softmax row: y[0, n) = softmax(x[0, n)), y[n, cols) = 0; y may alias x. next_x / next_y:
/// the row to prefetch meanwhile (or null). softmax and the fused host attention both use it.
template <class T>
KOKKOS_INLINE_FUNCTION void softmax_row(const T* xr, T* yr, std::int64_t n, std::int64_t cols, const T* next_x,
                                        T* next_y) {
  const T mx  = lane_max(xr, n);
  const T inv = T(1) / exp_sum_row(xr, n, mx, yr, next_x, next_y);
  for (std::int64_t j = 0; j < n; ++j) yr[j] *= inv;
  for (std::int64_t j = n; j < cols; ++j) yr[j] = T(0);
}

/// One softmax-backward row from the softmax output y: dx[0, n) = y (dy - sum(dy y)), the product
/// summed in lane order; dx[n, cols) = 0. dx may alias dy.
template <class T>
KOKKOS_INLINE_FUNCTION void softmax_backward_row(const T* yr, const T* dyr, T* dxr, std::int64_t n, std::int64_t cols) {
  T acc[row_lanes];
  for (int l = 0; l < row_lanes; ++l) acc[l] = T(0);
  std::int64_t j = 0;
  for (; j + row_lanes <= n; j += row_lanes)
    for (int l = 0; l < row_lanes; ++l) acc[l] += dyr[j + l] * yr[j + l];
  for (int l = 0; l < row_lanes; ++l)
    if (j + l < n) acc[l] += dyr[j + l] * yr[j + l];
  const T s = combine_lanes<T, T>(acc);
  for (j = 0; j < n; ++j) dxr[j] = yr[j] * (dyr[j] - s);
  for (j = n; j < cols; ++j) dxr[j] = T(0);
}

template <bool log_form, class Exec, class XV, class YV>
void softmax_impl(const Exec& exec, const XV& x, const YV& y, ops::Mask mask, const char* op) {
  static_check_view<Exec, XV>();
  static_check_view<Exec, YV>();
  require_same_shape(op, "x", x, "y", y);
  using T      = typename YV::non_const_value_type;
  const auto g = row_geometry(x, "x", mask, op);
  const T* xp  = x.data();
  T* yp        = y.data();
  if (rowwise_use_teams<Exec>()) {  // devices: a row over a team thread's vector lanes
    for_each_row_team(
        exec, op, g.nrows, KOKKOS_LAMBDA(const typename Kokkos::TeamPolicy<Exec>::member_type& m, std::int64_t r) {
          const T* xr          = xp + r * g.cols;
          T* yr                = yp + r * g.cols;
          const std::int64_t n = g.visible(r), cols = g.cols;
          const T mx  = vector_max(m, xr, n);
          const T s   = vector_sum<T>(m, n, [&](std::int64_t j) { return exp_nonpositive(xr[j] - mx); });
          const T lse = math::log(s), inv = T(1) / s;
          Kokkos::parallel_for(Kokkos::ThreadVectorRange(m, cols), [&](std::int64_t j) {
            if (log_form)
              yr[j] = j < n ? (xr[j] - mx) - lse : -infinity<T>();
            else
              yr[j] = j < n ? exp_nonpositive(xr[j] - mx) * inv : T(0);
          });
        });
    return;
  }
  Kokkos::parallel_for(
      op, Kokkos::RangePolicy<Exec>(exec, 0, g.nrows), KOKKOS_LAMBDA(std::int64_t r) {
        const T* xr          = xp + r * g.cols;
        T* yr                = yp + r * g.cols;
        const std::int64_t n = g.visible(r);
        // Simple loops over the row (it stays in L1): each vectorizes; exp is computed once.
        if (log_form) {
          const T mx      = lane_max(xr, n);
          const bool more = r + 1 < g.nrows;
          const T lse     = math::log(exp_sum_row(xr, n, mx, static_cast<T*>(nullptr), more ? xr + g.cols : nullptr,
                                              more ? yr + g.cols : nullptr));
          for (std::int64_t j = 0; j < n; ++j) yr[j] = (xr[j] - mx) - lse;
          for (std::int64_t j = n; j < g.cols; ++j) yr[j] = -infinity<T>();
        } else {
          const bool more = r + 1 < g.nrows;
          softmax_row(xr, yr, n, g.cols, more ? xr + g.cols : nullptr, more ? yr + g.cols : nullptr);
        }
      });
}

template <bool log_form, class Exec, class YV, class DYV, class DXV>
void softmax_backward_impl(const Exec& exec, const YV& y, const DYV& dy, const DXV& dx, ops::Mask mask,
                           const char* op) {
  static_check_view<Exec, YV>();
  static_check_view<Exec, DYV>();
  static_check_view<Exec, DXV>();
  require_same_shape(op, "y", y, "dy", dy);
  require_same_shape(op, "dx", dx, "y", y);
  using T      = typename DXV::non_const_value_type;
  const auto g = row_geometry(y, "y", mask, op);
  const T* yp  = y.data();
  const T* dyp = dy.data();
  T* dxp       = dx.data();
  if (rowwise_use_teams<Exec>()) {  // devices: a row over a team thread's vector lanes
    for_each_row_team(
        exec, op, g.nrows, KOKKOS_LAMBDA(const typename Kokkos::TeamPolicy<Exec>::member_type& m, std::int64_t r) {
          const T* yr          = yp + r * g.cols;
          const T* dyr         = dyp + r * g.cols;
          T* dxr               = dxp + r * g.cols;
          const std::int64_t n = g.visible(r), cols = g.cols;
          const T s = log_form ? vector_sum<T>(m, n, [&](std::int64_t j) { return dyr[j]; })
                               : vector_sum<T>(m, n, [&](std::int64_t j) { return dyr[j] * yr[j]; });
          Kokkos::parallel_for(Kokkos::ThreadVectorRange(m, cols), [&](std::int64_t j) {
            if (j >= n)
              dxr[j] = T(0);
            else if (log_form)
              dxr[j] = dyr[j] - exp_nonpositive(yr[j]) * s;
            else
              dxr[j] = yr[j] * (dyr[j] - s);
          });
        });
    return;
  }
  Kokkos::parallel_for(
      op, Kokkos::RangePolicy<Exec>(exec, 0, g.nrows), KOKKOS_LAMBDA(std::int64_t r) {
        const T* yr          = yp + r * g.cols;
        const T* dyr         = dyp + r * g.cols;
        T* dxr               = dxp + r * g.cols;
        const std::int64_t n = g.visible(r);
        if (log_form) {  // dx = dy - softmax * sum(dy)
          const T s = lane_sum<T>(dyr, n, [](T v) { return v; });
          for (std::int64_t j = 0; j < n; ++j) dxr[j] = dyr[j] - exp_nonpositive(yr[j]) * s;
          for (std::int64_t j = n; j < g.cols; ++j) dxr[j] = T(0);
        } else {  // dx = y * (dy - sum(dy * y))
          softmax_backward_row(yr, dyr, dxr, n, g.cols);
        }
      });
}

}  // namespace pmt::detail

namespace pmt::ops {

// ---------------------------------------------------------------------------------------------

/// \brief y = softmax(x) over the last dim; x, y: (R, C) or (B, R, C); y may alias x.
/// \throws pmt::ShapeError when shapes differ, or for a causal mask with R > C.
template <class Exec, class XV, class YV>
void softmax(const Exec& exec, const XV& x, const YV& y, Mask mask = Mask::None) {
  detail::softmax_impl<false>(exec, x, y, mask, "pmt::ops::softmax");
}

/// \brief dx = y (dy - sum(dy y)) row-wise, from the softmax output y; dx overwritten.
template <class Exec, class YV, class DYV, class DXV>
void softmax_backward(const Exec& exec, const YV& y, const DYV& dy, const DXV& dx, Mask mask = Mask::None) {
  detail::softmax_backward_impl<false>(exec, y, dy, dx, mask, "pmt::ops::softmax_backward");
}

/// \brief y = log_softmax(x) over the last dim (masked entries -inf); y may alias x.
template <class Exec, class XV, class YV>
void log_softmax(const Exec& exec, const XV& x, const YV& y, Mask mask = Mask::None) {
  detail::softmax_impl<true>(exec, x, y, mask, "pmt::ops::log_softmax");
}

/// \brief dx = dy - exp(y) sum(dy) row-wise, from the log-softmax output y; dx overwritten.
template <class Exec, class YV, class DYV, class DXV>
void log_softmax_backward(const Exec& exec, const YV& y, const DYV& dy, const DXV& dx, Mask mask = Mask::None) {
  detail::softmax_backward_impl<true>(exec, y, dy, dx, mask, "pmt::ops::log_softmax_backward");
}

}  // namespace pmt::ops
