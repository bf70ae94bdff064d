// SPDX-License-Identifier: Apache-2.0
#pragma once
// Optimizer update kernels on one parameter tensor (any rank) and its state: SGD with momentum
// and AdamW (bias correction, decoupled weight decay). Elementwise: bitwise independent of the
// thread count. Gradient scaling for clipping by global norm is ops::scale (elementwise.hpp) with
// the factor from ops::squared_norm (reduction.hpp). The optim/ layer drives these over a model,
// through their multi-tensor forms (multi_tensor.hpp: one loop over all parameters on the host);
// both forms compute each element with the same function (detail::sgd_element, adamw_element).

#include "pmt/core/error.hpp"
#include "pmt/core/tensor.hpp"
#include "pmt/detail/kokkos_compat.hpp"

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdint>

namespace pmt::ops {

/// \brief Hyper-parameters of SGD with momentum.
struct SgdParams {
  double lr = 1e-2, momentum = 0.9, weight_decay = 0.0;
};

/// \brief Hyper-parameters of AdamW (Loshchilov & Hutter); `step` counts from 1.
struct AdamWParams {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  std::int64_t step = 1;
};

}  // namespace pmt::ops

namespace pmt::detail {

/// SGD's per-step scalars in the parameters' type.
template <class T>
struct SgdStep {
  T lr, mu, wd;
};
template <class T>
SgdStep<T> sgd_step(const ops::SgdParams& h) {
  return {static_cast<T>(h.lr), static_cast<T>(h.momentum), static_cast<T>(h.weight_decay)};
}
/// One element of SGD with momentum (ops::sgd_update and ops::sgd_update_all).
template <class T, class P, class G, class V>
KOKKOS_INLINE_FUNCTION void sgd_element(const SgdStep<T>& st, P& p, const G& g, V& v) {
  v = st.mu * v + g + st.wd * p;
  p -= st.lr * v;
}

/// AdamW's per-step scalars in the state's type S. The bias corrections are folded into two
/// scalars, as PyTorch's AdamW does:
///   m^ / (sqrt(v^) + eps) = (1 / c1) m / (sqrt(v) / sqrt(c2) + eps),
/// so each element costs one sqrt and one division (not three divisions).
/// \throws pmt::ConfigError for step < 1.
template <class S>
struct AdamWStep {
  S b1, b2, eps, step_size, inv_sqrt_c2, decay;
};
template <class S>
AdamWStep<S> adamw_step(const char* op, const ops::AdamWParams& h) {
  require<ConfigError>(h.step >= 1, op, [&] {
    return str("step is ", h.step, "; expected step >= 1 (bias correction divides by 1 - beta^step)");
  });
  const double c1 = 1.0 - std::pow(h.beta1, static_cast<double>(h.step));
  const double c2 = 1.0 - std::pow(h.beta2, static_cast<double>(h.step));
  const S lr = static_cast<S>(h.lr), wd = static_cast<S>(h.weight_decay);
  return {static_cast<S>(h.beta1),
          static_cast<S>(h.beta2),
          static_cast<S>(h.eps),
          static_cast<S>(h.lr / c1),
          static_cast<S>(1.0 / std::sqrt(c2)),
          lr * wd};
}
/// One element of AdamW: parameter p (type T), gradient g, moments m and v (type S).
template <class S, class T, class G>
KOKKOS_INLINE_FUNCTION void adamw_element(const AdamWStep<S>& st, T& p, const G& g, S& m, S& v) {
  const S gi = static_cast<S>(g);
  const S mi = st.b1 * m + (S(1) - st.b1) * gi;
  const S vi = st.b2 * v + (S(1) - st.b2) * gi * gi;
  m          = mi;
  v          = vi;
  const S pi = static_cast<S>(p);
  p          = static_cast<T>(pi - st.step_size * mi / (math::sqrt(vi) * st.inv_sqrt_c2 + st.eps) - st.decay * pi);
}

}  // namespace pmt::detail

namespace pmt::ops {

/// \brief velocity = momentum velocity + (grad + weight_decay param); param -= lr velocity.
/// \throws pmt::ShapeError when param, grad and velocity differ in shape.
template <class Exec, class PV, class GV, class SV>
void sgd_update(const Exec& exec, const PV& param, const GV& grad, const SV& velocity, const SgdParams& h) {
  static_check_view<Exec, PV>();
  static_check_view<Exec, GV>();
  static_check_view<Exec, SV>();
  detail::require_same_shape("pmt::ops::sgd_update", "grad", grad, "param", param);
  detail::require_same_shape("pmt::ops::sgd_update", "velocity", velocity, "param", param);
  using T = typename PV::non_const_value_type;
  auto p = detail::flat(param), g = detail::flat(grad), v = detail::flat(velocity);
  const detail::SgdStep<T> st = detail::sgd_step<T>(h);
  Kokkos::parallel_for(
      "pmt::ops::sgd_update", Kokkos::RangePolicy<Exec>(exec, 0, p.extent(0)),
      KOKKOS_LAMBDA(std::size_t i) { detail::sgd_element(st, p(i), g(i), v(i)); });
}

/// \brief m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; param -= lr (m^/(sqrt(v^) + eps) + wd param)
/// with m^ = m / (1 - b1^step), v^ = v / (1 - b2^step).
/// \throws pmt::ShapeError when param, grad, m and v differ in shape; pmt::ConfigError for step < 1.
template <class Exec, class PV, class GV, class SV>
void adamw_update(const Exec& exec, const PV& param, const GV& grad, const SV& m, const SV& v, const AdamWParams& h) {
  static_check_view<Exec, PV>();
  static_check_view<Exec, GV>();
  static_check_view<Exec, SV>();
  constexpr const char* op = "pmt::ops::adamw_update";
  detail::require_same_shape(op, "grad", grad, "param", param);
  detail::require_same_shape(op, "m", m, "param", param);
  detail::require_same_shape(op, "v", v, "param", param);
  using S = typename SV::non_const_value_type;
  auto p = detail::flat(param), g = detail::flat(grad), fm = detail::flat(m), fv = detail::flat(v);
  const detail::AdamWStep<S> st = detail::adamw_step<S>(op, h);
  Kokkos::parallel_for(
      op, Kokkos::RangePolicy<Exec>(exec, 0, p.extent(0)),
      KOKKOS_LAMBDA(std::size_t i) { detail::adamw_element(st, p(i), g(i), fm(i), fv(i)); });
}

}  // namespace pmt::ops
