// SPDX-License-Identifier: Apache-2.0
#pragma once
// Elementwise ops on tensors of any rank (contiguous LayoutRight Views): add (residual add),
// scale, axpy, bias_add, GELU (tanh approximation, as GPT-2), ReLU, SiLU and tanh with their backward.
// Each element is computed independently: results are bitwise independent of the thread count.

#include "pmt/core/error.hpp"
#include "pmt/core/tensor.hpp"
#include "pmt/detail/kokkos_compat.hpp"
#include "pmt/ops/detail/host_backend.hpp"
#include "pmt/ops/detail/rowwise.hpp"

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>
#include <type_traits>

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
  Kokkos::parallel_for(
      "pmt::ops::add", Kokkos::RangePolicy<Exec>(exec, 0, fo.extent(0)),
      KOKKOS_LAMBDA(std::size_t i) { fo(i) = fa(i) + fb(i); });
}

/// \brief x *= s, in place (gradient scaling for clipping by global norm uses this).
template <class Exec, class XV>
void scale(const Exec& exec, const XV& x, typename XV::non_const_value_type s) {
  static_check_view<Exec, XV>();
  auto fx = detail::flat(x);
  Kokkos::parallel_for(
      "pmt::ops::scale", Kokkos::RangePolicy<Exec>(exec, 0, fx.extent(0)),
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
  Kokkos::parallel_for(
      "pmt::ops::axpy", Kokkos::RangePolicy<Exec>(exec, 0, fy.extent(0)),
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
    return detail::str("y is ", shape_str(y), " but bias is ", shape_str(bias), "; bias must have y's last extent ", C);
  });
  auto fy                = detail::flat(y);
  const std::size_t rows = C > 0 ? fy.extent(0) / C : 0;
  // One row per iteration: a contiguous loop over the bias (no i % C per element).
  Kokkos::parallel_for(
      "pmt::ops::bias_add", Kokkos::RangePolicy<Exec>(exec, 0, rows), KOKKOS_LAMBDA(std::size_t r) {
        for (std::size_t c = 0; c < C; ++c) fy(r * C + c) += bias(c);
      });
}

}  // namespace pmt::ops

namespace pmt::detail {
// GELU, tanh approximation, written with 0.5 (1 + tanh(u)) = 1 / (1 + exp(-2u)) (one exp and
// one division; accurate near 0, where 1 - 2 / (exp(2u) + 1) cancels):
//   gelu(x)  = x s,  s = 1 / (1 + exp(-2u)),  u = sqrt(2/pi) (x + 0.044715 x^3)
//   gelu'(x) = s + x s (1 - s) 2 du/dx
inline constexpr double gelu_k = 0.7978845608028654;  // sqrt(2 / pi)
inline constexpr double gelu_a = 0.044715;

template <class T>
KOKKOS_INLINE_FUNCTION T gelu_exp_minus_2u(T x) {
  const T z = T(-2 * gelu_k) * (x + T(gelu_a) * x * x * x);
  if constexpr (std::is_same_v<T, float>)
    return exp_fast(z);  // clamps to [-87, 88]
  else
    return math::exp(z);
}
template <class T>
KOKKOS_INLINE_FUNCTION T gelu_tanh(T x) {
  return x / (T(1) + gelu_exp_minus_2u(x));
}
template <class T>
KOKKOS_INLINE_FUNCTION T gelu_tanh_grad(T x) {
  const T s = T(1) / (T(1) + gelu_exp_minus_2u(x));
  return s + x * s * (T(1) - s) * T(2 * gelu_k) * (T(1) + T(3 * gelu_a) * x * x);
}

/// The tanh GELU's constants for a host SIMD back end K, rounded to float as the portable loops
/// round them.
template <class K>
typename K::GeluConstants gelu_constants() {
  return {static_cast<float>(-2 * gelu_k), static_cast<float>(gelu_a), static_cast<float>(2 * gelu_k),
          static_cast<float>(3 * gelu_a)};
}

/// y[i] = f(x[i]) over contiguous elements with the host SIMD back end K: fw(i) does K::width
/// elements from i, f1(i) one; chunks of 64 per iteration, the last chunk's tail element by
/// element. Only for host spaces whose back end has SIMD kernels (host_kernels_t).
template <class K, class Exec, class FW, class F1>
void host_simd_map(const Exec& exec, const char* label, std::size_t n, FW fw, F1 f1) {
  constexpr std::size_t chunk = 64, w = K::width;
  static_assert(chunk % w == 0, "pmt: a SIMD back end's width must divide the chunk");
  Kokkos::parallel_for(label, Kokkos::RangePolicy<Exec>(exec, 0, (n + chunk - 1) / chunk), [=](std::size_t c) {
    const std::size_t lo = c * chunk, hi = lo + chunk < n ? lo + chunk : n;
    std::size_t i = lo;
    for (; i + w <= hi; i += w) fw(i);
    for (; i < hi; ++i) f1(i);
  });
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
  using T = typename YV::non_const_value_type;
  using K = detail::host_kernels_t<Exec, T>;
  if constexpr (K::simd && std::is_same_v<typename XV::non_const_value_type, T>) {
    const auto* xp = fx.data();
    T* yp          = fy.data();
    const auto c   = detail::gelu_constants<K>();
    detail::host_simd_map<K>(
        exec, "pmt::ops::gelu", fy.extent(0), [=](std::size_t i) { K::gelu(xp, yp, i, c); },
        [=](std::size_t i) { yp[i] = detail::gelu_tanh(xp[i]); });
    return;
  }
  Kokkos::parallel_for(
      "pmt::ops::gelu", Kokkos::RangePolicy<Exec>(exec, 0, fy.extent(0)),
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
  using T = typename DXV::non_const_value_type;
  using K = detail::host_kernels_t<Exec, T>;
  if constexpr (K::simd && std::is_same_v<typename XV::non_const_value_type, T> &&
                std::is_same_v<typename DYV::non_const_value_type, T>) {
    const auto* xp  = fx.data();
    const auto* dyp = fdy.data();
    T* dxp          = fdx.data();
    const auto c    = detail::gelu_constants<K>();
    detail::host_simd_map<K>(
        exec, "pmt::ops::gelu_backward", fx.extent(0), [=](std::size_t i) { K::gelu_backward(xp, dyp, dxp, i, c); },
        [=](std::size_t i) { dxp[i] = dyp[i] * detail::gelu_tanh_grad(xp[i]); });
    return;
  }
  Kokkos::parallel_for(
      "pmt::ops::gelu_backward", Kokkos::RangePolicy<Exec>(exec, 0, fx.extent(0)),
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
  Kokkos::parallel_for(
      "pmt::ops::relu", Kokkos::RangePolicy<Exec>(exec, 0, fy.extent(0)),
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
  Kokkos::parallel_for(
      "pmt::ops::relu_backward", Kokkos::RangePolicy<Exec>(exec, 0, fx.extent(0)),
      KOKKOS_LAMBDA(std::size_t i) { fdx(i) = fx(i) > T(0) ? fdy(i) : T(0); });
}

/// \brief y = SiLU(x) = x / (1 + exp(-x)) (x sigmoid(x)). y may alias x.
/// \throws pmt::ShapeError when the shapes differ.
template <class Exec, class XV, class YV>
void silu(const Exec& exec, const XV& x, const YV& y) {
  static_check_view<Exec, XV>();
  static_check_view<Exec, YV>();
  detail::require_same_shape("pmt::ops::silu", "x", x, "y", y);
  using T = typename YV::non_const_value_type;
  auto fx = detail::flat(x), fy = detail::flat(y);
  Kokkos::parallel_for(
      "pmt::ops::silu", Kokkos::RangePolicy<Exec>(exec, 0, fy.extent(0)),
      KOKKOS_LAMBDA(std::size_t i) { fy(i) = fx(i) / (T(1) + detail::math::exp(-fx(i))); });
}

/// \brief dx = dy (s + x s (1 - s)) with s = sigmoid(x) (dx overwritten).
/// \throws pmt::ShapeError when the shapes differ.
template <class Exec, class XV, class DYV, class DXV>
void silu_backward(const Exec& exec, const XV& x, const DYV& dy, const DXV& dx) {
  static_check_view<Exec, XV>();
  static_check_view<Exec, DYV>();
  static_check_view<Exec, DXV>();
  detail::require_same_shape("pmt::ops::silu_backward", "x", x, "dy", dy);
  detail::require_same_shape("pmt::ops::silu_backward", "dx", dx, "x", x);
  using T = typename DXV::non_const_value_type;
  auto fx = detail::flat(x), fdy = detail::flat(dy), fdx = detail::flat(dx);
  Kokkos::parallel_for(
      "pmt::ops::silu_backward", Kokkos::RangePolicy<Exec>(exec, 0, fx.extent(0)), KOKKOS_LAMBDA(std::size_t i) {
        const T s = T(1) / (T(1) + detail::math::exp(-fx(i)));
        fdx(i)    = fdy(i) * (s + fx(i) * s * (T(1) - s));
      });
}

/// \brief y = tanh(x). y may alias x. \throws pmt::ShapeError when the shapes differ.
template <class Exec, class XV, class YV>
void tanh(const Exec& exec, const XV& x, const YV& y) {
  static_check_view<Exec, XV>();
  static_check_view<Exec, YV>();
  detail::require_same_shape("pmt::ops::tanh", "x", x, "y", y);
  auto fx = detail::flat(x), fy = detail::flat(y);
  Kokkos::parallel_for(
      "pmt::ops::tanh", Kokkos::RangePolicy<Exec>(exec, 0, fy.extent(0)),
      KOKKOS_LAMBDA(std::size_t i) { fy(i) = detail::math::tanh(fx(i)); });
}

/// \brief dx = dy (1 - y^2), from the forward's OUTPUT y = tanh(x) (dx overwritten).
/// \throws pmt::ShapeError when the shapes differ.
template <class Exec, class YV, class DYV, class DXV>
void tanh_backward(const Exec& exec, const YV& y, const DYV& dy, const DXV& dx) {
  static_check_view<Exec, YV>();
  static_check_view<Exec, DYV>();
  static_check_view<Exec, DXV>();
  detail::require_same_shape("pmt::ops::tanh_backward", "y", y, "dy", dy);
  detail::require_same_shape("pmt::ops::tanh_backward", "dx", dx, "y", y);
  using T = typename DXV::non_const_value_type;
  auto fy = detail::flat(y), fdy = detail::flat(dy), fdx = detail::flat(dx);
  Kokkos::parallel_for(
      "pmt::ops::tanh_backward", Kokkos::RangePolicy<Exec>(exec, 0, fy.extent(0)),
      KOKKOS_LAMBDA(std::size_t i) { fdx(i) = fdy(i) * (T(1) - fy(i) * fy(i)); });
}

}  // namespace pmt::ops
