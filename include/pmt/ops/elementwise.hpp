// SPDX-License-Identifier: Apache-2.0
#pragma once
// Elementwise ops on tensors of any rank (contiguous LayoutRight Views): add (residual add),
// scale, axpy, bias_add, GELU (tanh approximation, as GPT-2) and ReLU with their backward.
// Each element is computed independently: results are bitwise independent of the thread count.

#include "pmt/core/error.hpp"
#include "pmt/detail/kokkos_compat.hpp"
#include "pmt/core/tensor.hpp"
#include "pmt/ops/detail/rowwise.hpp"

#include <Kokkos_Core.hpp>

#include <cstdint>

namespace pmt::ops {

/// \brief out = a + b (same shapes; out may alias a or b). Residual connections use this.
/// \throws pmt::ShapeError when the shapes differ.
template <class Exec, class AV, class BV, class OV>
void add(const Exec& exec, const AV& a, const BV& b, const OV& out) {
  static_check_view<Exec, AV>();
  static_check_view<Exec, BV>();
  static_check_view<Exec, OV>();
  detail::require_same_shape("pmt::ops::add", "a", a, "b", b);
  detail::require_same_shape("pmt::ops::add", "out", out, "a", a);
  auto fa = detail::flat(a), fb = detail::flat(b), fo = detail::flat(out);
  Kokkos::parallel_for("pmt::ops::add", Kokkos::RangePolicy<Exec>(exec, 0, fo.extent(0)),
                       KOKKOS_LAMBDA(std::size_t i) { fo(i) = fa(i) + fb(i); });
}

/// \brief x *= s, in place (gradient scaling for clipping by global norm uses this).
template <class Exec, class XV>
void scale(const Exec& exec, const XV& x, typename XV::non_const_value_type s) {
  static_check_view<Exec, XV>();
  auto fx = detail::flat(x);
  Kokkos::parallel_for("pmt::ops::scale", Kokkos::RangePolicy<Exec>(exec, 0, fx.extent(0)),
                       KOKKOS_LAMBDA(std::size_t i) { fx(i) *= s; });
}

/// \brief y += alpha x (same shapes).
/// \throws pmt::ShapeError when the shapes differ.
template <class Exec, class XV, class YV>
void axpy(const Exec& exec, typename YV::non_const_value_type alpha, const XV& x, const YV& y) {
  static_check_view<Exec, XV>();
  static_check_view<Exec, YV>();
  detail::require_same_shape("pmt::ops::axpy", "x", x, "y", y);
  auto fx = detail::flat(x), fy = detail::flat(y);
  Kokkos::parallel_for("pmt::ops::axpy", Kokkos::RangePolicy<Exec>(exec, 0, fy.extent(0)),
                       KOKKOS_LAMBDA(std::size_t i) { fy(i) += alpha * fx(i); });
}

/// \brief y(..., c) += bias(c) for every leading index, in place.  y: (..., C), bias: (C).
/// \throws pmt::ShapeError when bias' extent is not y's last extent.
template <class Exec, class YV, class BV>
void bias_add(const Exec& exec, const YV& y, const BV& bias) {
  static_check_view<Exec, YV>();
  static_check_view<Exec, BV>();
  static_assert(BV::rank == 1, "pmt::ops::bias_add: bias must be a rank-1 View");
  const std::size_t C = y.extent(static_cast<std::size_t>(YV::rank) - 1);
  detail::require(bias.extent(0) == C, "pmt::ops::bias_add", [&] {
    return detail::str("y is ", shape_str(y), " but bias is ", shape_str(bias),
                       "; bias must have y's last extent ", C);
  });
  auto fy = detail::flat(y);
  Kokkos::parallel_for("pmt::ops::bias_add", Kokkos::RangePolicy<Exec>(exec, 0, fy.extent(0)),
                       KOKKOS_LAMBDA(std::size_t i) { fy(i) += bias(i % C); });
}

}  // namespace pmt::ops

namespace pmt::detail {
template <class T>
KOKKOS_INLINE_FUNCTION T gelu_tanh(T x) {
  const T k = T(0.7978845608028654);  // sqrt(2 / pi)
  return T(0.5) * x * (T(1) + tanh_fast(k * (x + T(0.044715) * x * x * x)));
}
template <class T>
KOKKOS_INLINE_FUNCTION T gelu_tanh_grad(T x) {
  const T k     = T(0.7978845608028654);
  const T u     = k * (x + T(0.044715) * x * x * x);
  const T t     = tanh_fast(u);
  const T du_dx = k * (T(1) + T(3) * T(0.044715) * x * x);
  return T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * du_dx;
}
}  // namespace pmt::detail

namespace pmt::ops {

/// \brief y = GELU(x), tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
/// y may alias x. \throws pmt::ShapeError when the shapes differ.
template <class Exec, class XV, class YV>
void gelu(const Exec& exec, const XV& x, const YV& y) {
  static_check_view<Exec, XV>();
  static_check_view<Exec, YV>();
  detail::require_same_shape("pmt::ops::gelu", "x", x, "y", y);
  auto fx = detail::flat(x), fy = detail::flat(y);
  Kokkos::parallel_for("pmt::ops::gelu", Kokkos::RangePolicy<Exec>(exec, 0, fy.extent(0)),
                       KOKKOS_LAMBDA(std::size_t i) { fy(i) = detail::gelu_tanh(fx(i)); });
}

/// \brief dx = dy * GELU'(x) (dx overwritten; dx may alias dy).
/// \throws pmt::ShapeError when the shapes differ.
template <class Exec, class XV, class DYV, class DXV>
void gelu_backward(const Exec& exec, const XV& x, const DYV& dy, const DXV& dx) {
  static_check_view<Exec, XV>();
  static_check_view<Exec, DYV>();
  static_check_view<Exec, DXV>();
  detail::require_same_shape("pmt::ops::gelu_backward", "x", x, "dy", dy);
  detail::require_same_shape("pmt::ops::gelu_backward", "dx", dx, "x", x);
  auto fx = detail::flat(x), fdy = detail::flat(dy), fdx = detail::flat(dx);
  Kokkos::parallel_for("pmt::ops::gelu_backward", Kokkos::RangePolicy<Exec>(exec, 0, fx.extent(0)),
                       KOKKOS_LAMBDA(std::size_t i) { fdx(i) = fdy(i) * detail::gelu_tanh_grad(fx(i)); });
}

/// \brief y = max(x, 0). y may alias x. \throws pmt::ShapeError when the shapes differ.
template <class Exec, class XV, class YV>
void relu(const Exec& exec, const XV& x, const YV& y) {
  static_check_view<Exec, XV>();
  static_check_view<Exec, YV>();
  detail::require_same_shape("pmt::ops::relu", "x", x, "y", y);
  using T = typename YV::non_const_value_type;
  auto fx = detail::flat(x), fy = detail::flat(y);
  Kokkos::parallel_for("pmt::ops::relu", Kokkos::RangePolicy<Exec>(exec, 0, fy.extent(0)),
                       KOKKOS_LAMBDA(std::size_t i) { fy(i) = fx(i) > T(0) ? fx(i) : T(0); });
}

/// \brief dx = dy where x > 0, else 0 (dx overwritten).
/// \throws pmt::ShapeError when the shapes differ.
template <class Exec, class XV, class DYV, class DXV>
void relu_backward(const Exec& exec, const XV& x, const DYV& dy, const DXV& dx) {
  static_check_view<Exec, XV>();
  static_check_view<Exec, DYV>();
  static_check_view<Exec, DXV>();
  detail::require_same_shape("pmt::ops::relu_backward", "x", x, "dy", dy);
  detail::require_same_shape("pmt::ops::relu_backward", "dx", dx, "x", x);
  using T = typename DXV::non_const_value_type;
  auto fx = detail::flat(x), fdy = detail::flat(dy), fdx = detail::flat(dx);
  Kokkos::parallel_for("pmt::ops::relu_backward", Kokkos::RangePolicy<Exec>(exec, 0, fx.extent(0)),
                       KOKKOS_LAMBDA(std::size_t i) { fdx(i) = fx(i) > T(0) ? fdy(i) : T(0); });
}

}  // namespace pmt::ops
