// SPDX-License-Identifier: Apache-2.0
#pragma once
// CausalSelfAttention<T, Exec>: multi-head causal self-attention with the heads split over tp.
// q, k and v come from one column-split projection of width 3C (QkvProjection: one product,
// C -> 3 C/tp, this rank's H/tp heads of each), the output projection is Linear<Row> (C/tp -> C).
// Legend: B batch, T sequence, N = B T rows, C width, Cl = C / tp, H heads, tp degree.
//   x (N, C) -> qkv (N, 3 Cl) = [q | k | v] -> attention (B, T, Cl) -> proj (N, C)
// Communication: forward one all_reduce(tp) (proj); backward one (the projection's dx).
// The fused weight W (C, 3, C) is stored as a (3C, C) matrix whose row 3 i + g holds input feature
// i of projection g (q, k, v) and whose columns are split over tp like a Col layer's, so each
// rank's shard (3C, Cl) is, read as (C, 3 Cl), the weight of x -> [q | k | v] of its heads, and a
// checkpoint reshards it like any column-split matrix. Its three (C, C) parts draw the RNG streams
// first_stream, +1, +2 (as three separate layers would).
// The key projection has no bias: adding a vector to every key shifts all scores of a query by
// the same amount, which softmax ignores, so its gradient is identically zero and an optimizer
// like Adam would only turn rounding noise into parameter noise (which also breaks the
// bitwise-reproducible comparison of layouts).

#include "pmt/core/instrument.hpp"
#include "pmt/comm/backend.hpp"
#include "pmt/comm/mesh.hpp"
#include "pmt/core/error.hpp"
#include "pmt/core/random.hpp"
#include "pmt/core/tensor.hpp"
#include "pmt/nn/linear.hpp"
#include "pmt/nn/module.hpp"
#include "pmt/core/activation_slot.hpp"
#include "pmt/ops/attention.hpp"
#include "pmt/ops/elementwise.hpp"
#include "pmt/parallel/regions.hpp"
#include "pmt/core/workspace.hpp"

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace pmt::detail {
/// y(n, :) = [bq | 0 | bv] for every row n (a free function: CUDA's device lambdas may not sit in
/// a private member).
template <class Exec, class YV, class BV>
void fill_qkv_bias(const Exec& exec, const YV& y, const BV& bq, const BV& bv) {
  const auto Cl = static_cast<std::int64_t>(bq.extent(0));
  Kokkos::parallel_for("pmt::nn::QkvProjection::fill_bias",
                       Kokkos::RangePolicy<Exec>(exec, 0, static_cast<std::int64_t>(y.extent(0))), KOKKOS_LAMBDA(std::int64_t n) {
                         for (std::int64_t j = 0; j < Cl; ++j) y(n, j) = bq(j);
                         for (std::int64_t j = 0; j < Cl; ++j) y(n, Cl + j) = 0;
                         for (std::int64_t j = 0; j < Cl; ++j) y(n, 2 * Cl + j) = bv(j);
                       });
}
/// gq += s[0, Cl), gv += s[2 Cl, 3 Cl): the column sums of dy into the q and v biases' gradients.
template <class Exec, class SV, class GV>
void add_qkv_bias_grads(const Exec& exec, const SV& s, const GV& gq, const GV& gv) {
  const auto Cl = static_cast<std::int64_t>(gq.extent(0));
  Kokkos::parallel_for("pmt::nn::QkvProjection::bias_grads", Kokkos::RangePolicy<Exec>(exec, 0, Cl), KOKKOS_LAMBDA(std::int64_t j) {
    gq(j) += s(j);
    gv(j) += s(2 * Cl + j);
  });
}
}  // namespace pmt::detail

namespace pmt::nn {

/// \brief q, k and v of attention in one column-split product (see the file comment): x (N, C)
/// -> (N, 3 Cl) = [q | k | v] of this rank's heads. q and v have a bias, k none. Parameters: the
/// fused weight (3C, C) split by columns, then the biases of q and v (C each, split).
template <class T, class Exec = Kokkos::DefaultExecutionSpace, class Backend = comm::default_backend_t<Exec>>
class QkvProjection {
 public:
  /// Weights from RNG streams first_stream (q), + 1 (k), + 2 (v), N(0, init_std^2).
  /// \throws pmt::ShapeError when C is not divisible by tp.
  QkvProjection(const Mesh<Backend>& mesh, std::size_t C, RngKey first, double init_std = 0.02)
      : m_tp(mesh.comm(Axis::tp)), m_C(C) {
    const auto tp = static_cast<std::size_t>(m_tp.size()), r = static_cast<std::size_t>(m_tp.rank());
    detail::require(C % tp == 0, "pmt::nn::QkvProjection", [&] {
      return detail::str("width ", C, " is not divisible by tp = ", tp);
    });
    const std::size_t Cl = C / tp;
    GlobalSlice ws;
    ws.extent[0] = 3 * C, ws.extent[1] = C, ws.offset[1] = r * Cl;
    m_w = Parameter<T, Exec>("pmt::nn::QkvProjection::weight", {3 * C, Cl}, ws, false);
    // part g (C, C) of the global weight, this rank's columns, into rows 3 i + g
    Tensor<T, 2, Exec> part("pmt::nn::QkvProjection::init", C, Cl);
    GlobalSlice ps;
    ps.extent[0] = C, ps.extent[1] = C, ps.offset[1] = r * Cl;
    const auto w3 = Kokkos::View<T***, Kokkos::LayoutRight, typename Exec::memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(
        m_w.value.data(), C, 3, Cl);
    for (std::uint32_t g = 0; g < 3; ++g) {
      fill_normal(Exec(), part, RngKey{first.seed, first.stream + g}, 0.0, init_std, ps);
      Kokkos::deep_copy(Exec(), Kokkos::subview(w3, Kokkos::ALL, g, Kokkos::ALL), part);
    }
    GlobalSlice bs;
    bs.extent[0] = C, bs.offset[0] = r * Cl;
    m_bq = Parameter<T, Exec>("pmt::nn::QkvProjection::bias_q", {Cl}, bs, false);
    m_bv = Parameter<T, Exec>("pmt::nn::QkvProjection::bias_v", {Cl}, bs, false);
    m_sums = Tensor<T, 1, Exec>("pmt::nn::QkvProjection::column_sums", 3 * Cl);
    Exec().fence();
  }

  /// \brief qkv (N, 3 Cl) = x W + [bq | 0 | bv]; keeps x for backward.
  Tensor<T, 2, Exec> forward(const Exec& exec, const Tensor<T, 2, Exec>& x) {
    detail::require(x.extent(1) == m_C, "pmt::nn::QkvProjection::forward", [&] {
      return detail::str("x is ", shape_str(x), "; expected (N, ", m_C, ")");
    });
    const Instrument instrument("pmt::nn::QkvProjection::forward");
    if (grad_enabled()) *m_x = x;
    auto y = workspace_view<Tensor<T, 2, Exec>>("pmt::nn::QkvProjection::y", x.extent(0), 3 * local());
    detail::fill_qkv_bias(exec, y, m_bq.value, m_bv.value);
    ops::matmul(exec, ops::Trans::N, ops::Trans::N, T(1), x, weight(m_w.value), T(1), y);
    return y;
  }
  /// \brief dW += x^T dqkv, dbq and dbv += column sums, returns dx = dqkv W^T summed over tp.
  Tensor<T, 2, Exec> backward(const Exec& exec, const Tensor<T, 2, Exec>& dy) {
    const Instrument instrument("pmt::nn::QkvProjection::backward");
    const Tensor<T, 2, Exec> x = m_x.take();
    detail::require(x.data() != nullptr && dy.extent(0) == x.extent(0) && dy.extent(1) == 3 * local(),
                    "pmt::nn::QkvProjection::backward", [&] {
                      return detail::str("dqkv is ", shape_str(dy), " but forward saw x ", shape_str(x), " and produced (",
                                         x.extent(0), ", ", 3 * local(), "); call forward first (each backward consumes its "
                                         "forward's saved input)");
                    });
    ops::matmul(exec, ops::Trans::T, ops::Trans::N, T(1), x, dy, T(1), weight(m_w.grad));  // (C, 3 Cl)
    ops::column_sum(exec, dy, m_sums, T(0));
    detail::add_qkv_bias_grads(exec, m_sums, m_bq.grad, m_bv.grad);
    auto dx = workspace_view<Tensor<T, 2, Exec>>("pmt::nn::QkvProjection::dx", dy.extent(0), m_C);
    ops::matmul(exec, ops::Trans::N, ops::Trans::T, T(1), dy, weight(m_w.value), T(0), dx);  // (N, C)
    parallel::copy_to_backward(m_tp, exec, dx);  // x entered the column-split region whole
    return dx;
  }
  std::vector<Parameter<T, Exec>*> parameters() { return {&m_w, &m_bq, &m_bv}; }
  /// \brief This rank's width of each of q, k and v (C / tp).
  std::size_t local() const noexcept { return m_C / static_cast<std::size_t>(m_tp.size()); }

 private:
  /// The (3C, Cl) shard read as the (C, 3 Cl) weight of x -> [q | k | v].
  auto weight(const Tensor<T, 1, Exec>& flat) const {
    return Kokkos::View<T**, Kokkos::LayoutRight, typename Exec::memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(
        flat.data(), m_C, 3 * local());
  }
  comm::Communicator<Backend> m_tp;
  std::size_t m_C;
  Parameter<T, Exec> m_w, m_bq, m_bv;
  Tensor<T, 1, Exec> m_sums;       // column sums of dqkv (3 Cl)
  Saved<Tensor<T, 2, Exec>> m_x;   // the input, per activation slot
};

/// \brief Multi-head causal self-attention with the heads split over tp (see the file comment):
/// x (B T, C) replicated -> y (B T, C) replicated; one all-reduce forward and one backward.
/// \throws pmt::ShapeError when C is not divisible by the heads or the heads by tp, or an input
/// is not (B T, C).
template <class T, class Exec = Kokkos::DefaultExecutionSpace, class Backend = comm::default_backend_t<Exec>>
class CausalSelfAttention {
 public:
  using value_type       = T;
  using execution_space  = Exec;
  using input_placement  = Replicated;
  using output_placement = Replicated;
  static constexpr bool nonlinear = true;

  /// Weights use RNG streams first_stream .. first_stream + 3 (q, k, v, proj).
  /// \throws pmt::ShapeError when C is not divisible by H or H by tp.
  CausalSelfAttention(const Mesh<Backend>& mesh, std::size_t C, std::size_t H, std::uint64_t seed,
                      std::uint32_t first_stream)
      : m_tp(mesh.comm(Axis::tp)), m_C(C), m_H(H),
        m_qkv(checked(mesh, C, H), C, RngKey{seed, first_stream}),
        m_proj(mesh, C, C, RngKey{seed, first_stream + 3}) {}

  /// \brief y (N, C) from x (N, C) holding B sequences of T tokens.
  Tensor<T, 2, Exec> forward(const Exec& exec, const Tensor<T, 2, Exec>& x, std::size_t B, std::size_t Tn) {
    detail::require(x.extent(0) == B * Tn && x.extent(1) == m_C, "pmt::nn::CausalSelfAttention::forward", [&] {
      return detail::str("x is ", shape_str(x), "; expected (B T, C) = (", B * Tn, ", ", m_C, ")");
    });
    const Instrument instrument("pmt::nn::CausalSelfAttention::forward");
    const std::size_t Cl = m_C / static_cast<std::size_t>(m_tp.size()), Hl = m_H / static_cast<std::size_t>(m_tp.size());
    // pmt::NoGrad / KeepNothing: the buffers come from the workspace and go back after this
    // forward, so every layer's no-grad forward (recomputation's first pass, evaluation) reuses
    // the same ones instead of each layer holding its own
    Cache scratch;
    Cache& saved = grad_enabled() ? *m_saved : scratch;
    if (saved.cache.B != static_cast<std::int64_t>(B) || saved.cache.T_ != static_cast<std::int64_t>(Tn))
      saved.cache = ops::make_attention_cache<T, Exec>(static_cast<std::int64_t>(B), static_cast<std::int64_t>(Tn),
                                                   static_cast<std::int64_t>(Cl), static_cast<std::int64_t>(Hl));
    auto qkv = m_qkv.forward(exec, x);  // (N, 3 C/tp) = [q | k | v]
    auto att = workspace_view<Tensor<T, 2, Exec>>("pmt::nn::attention::out", B * Tn, Cl);
    ops::attention_forward(exec, as3(qkv, B, Tn), as3(att, B, Tn), saved.cache);
    return m_proj.forward(exec, att);  // (N, C), all-reduced over tp
  }

  /// \brief dx (N, C) from dy (N, C).
  Tensor<T, 2, Exec> backward(const Exec& exec, const Tensor<T, 2, Exec>& dy) {
    const Instrument instrument("pmt::nn::CausalSelfAttention::backward");
    auto saved   = m_saved.take();
    const auto B = static_cast<std::size_t>(saved.cache.B), Tn = static_cast<std::size_t>(saved.cache.T_);
    detail::require(saved.cache.q.data() != nullptr && dy.extent(0) == B * Tn, "pmt::nn::CausalSelfAttention::backward",
                    [&] {
                      return detail::str("dy is ", shape_str(dy), " but the saved forward is (B T, C) = (", B * Tn,
                                         ", ", m_C, "); call forward first (each backward consumes its forward's "
                                         "activations)");
                    });
    const std::size_t Cl = m_C / static_cast<std::size_t>(m_tp.size());
    auto datt = m_proj.backward(exec, dy);  // (N, C/tp)
    // every element written by attention_backward
    auto dqkv = workspace_view<Tensor<T, 2, Exec>>("pmt::nn::attention::dqkv", B * Tn, 3 * Cl);
    ops::attention_backward(exec, as3(datt, B, Tn), as3(dqkv, B, Tn), saved.cache);
    return m_qkv.backward(exec, dqkv);  // all-reduced over tp
  }

  std::vector<Parameter<T, Exec>*> parameters() {
    std::vector<Parameter<T, Exec>*> all = m_qkv.parameters();
    for (auto* p : m_proj.parameters()) all.push_back(p);
    return all;
  }

 private:
  static const Mesh<Backend>& checked(const Mesh<Backend>& mesh, std::size_t C, std::size_t H) {
    const auto tp = static_cast<std::size_t>(mesh.degree(Axis::tp));
    detail::require(H > 0 && C % H == 0, "pmt::nn::CausalSelfAttention", [&] {
      return detail::str("width ", C, " is not divisible by heads ", H);
    });
    detail::require(H % tp == 0, "pmt::nn::CausalSelfAttention", [&] {
      return detail::str("heads ", H, " are not divisible by tp = ", tp, " (heads are split over tp)");
    });
    return mesh;
  }
  static auto as3(const Tensor<T, 2, Exec>& v, std::size_t B, std::size_t Tn) {
    return Kokkos::View<T***, Kokkos::LayoutRight, typename Exec::memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(
        v.data(), B, Tn, v.extent(1));
  }

  comm::Communicator<Backend> m_tp;
  std::size_t m_C, m_H;
  QkvProjection<T, Exec, Backend> m_qkv;
  Linear<T, TensorSplit<Row>, Exec, Backend> m_proj;
  struct Cache {
    ops::AttentionCache<T, Exec> cache;
  };
  Saved<Cache> m_saved;  // per activation slot
};

}  // namespace pmt::nn
