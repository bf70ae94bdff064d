// SPDX-License-Identifier: Apache-2.0
#pragma once
// CausalSelfAttention<T, Exec>: multi-head causal self-attention with the heads split over tp.
// q, k and v come from one column-split projection of width 3C (QkvProjection: one product,
// C -> 3 C/tp, this rank's H/tp heads of each), the output projection is Linear<Row> (C/tp -> C).
// Legend: B batch, T sequence, N = B T rows, C width, Cl = C / tp, H heads, tp degree.
//   x (N, C) -> qkv (N, 3 Cl) = [q | k | v] -> attention (B, T, Cl) -> proj (N, C)
// Communication: forward one all_reduce(tp) (proj); backward one (the projection's dx).
// Sequence parallelism (the `sequence_parallel` constructor argument): x and y are this rank's
// N/tp rows; the fused projection all-gathers x (forward, and again in backward: only N/tp rows are
// kept) and reduce-scatters dx, the output projection reduce-scatters y and all-gathers dy.
// Selective recomputation (recompute_attention(true), Megatron's "selective"): the forward keeps
// the fused projection's output [q | k | v] (N, 3 Cl) instead of the attention's own buffers (the
// split heads and the T x T softmax output per head), and the backward runs the attention's
// forward again from it first: the same values bit for bit, one attention core more per backward.
// The fused weight W (C, 3, C) is stored as a (3C, C) matrix whose row 3 i + g holds input feature
// i of projection g (q, k, v) and whose columns are split over tp like a Col layer's, so each
// rank's shard (3C, Cl) is, read as (C, 3 Cl), the weight of x -> [q | k | v] of its heads, and a
// checkpoint reshards it like any column-split matrix. Its three (C, C) parts draw the RNG streams
// first_stream, +1, +2 (as three separate layers would).
// The key projection has no bias: adding a vector to every key shifts all scores of a query by
// the same amount, which softmax ignores, so its gradient is identically zero and an optimizer
// like Adam would only turn rounding noise into parameter noise (which also breaks the
// bitwise-reproducible comparison of layouts).

#include "pmt/comm/backend.hpp"
#include "pmt/comm/mesh.hpp"
#include "pmt/core/activation_slot.hpp"
#include "pmt/core/error.hpp"
#include "pmt/core/instrument.hpp"
#include "pmt/core/random.hpp"
#include "pmt/core/step_context.hpp"
#include "pmt/core/tensor.hpp"
#include "pmt/core/workspace.hpp"
#include "pmt/nn/linear.hpp"
#include "pmt/nn/module.hpp"
#include "pmt/ops/attention.hpp"
#include "pmt/ops/elementwise.hpp"
#include "pmt/parallel/regions.hpp"

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
  Kokkos::parallel_for(
      "pmt::nn::QkvProjection::fill_bias", Kokkos::RangePolicy<Exec>(exec, 0, static_cast<std::int64_t>(y.extent(0))),
      KOKKOS_LAMBDA(std::int64_t n) {
        for (std::int64_t j = 0; j < Cl; ++j) y(n, j) = bq(j);
        for (std::int64_t j = 0; j < Cl; ++j) y(n, Cl + j) = 0;
        for (std::int64_t j = 0; j < Cl; ++j) y(n, 2 * Cl + j) = bv(j);
      });
}
/// gq += s[0, Cl), gv += s[2 Cl, 3 Cl): the column sums of dy into the q and v biases' gradients.
template <class Exec, class SV, class GV>
void add_qkv_bias_grads(const Exec& exec, const SV& s, const GV& gq, const GV& gv) {
  const auto Cl = static_cast<std::int64_t>(gq.extent(0));
  Kokkos::parallel_for(
      "pmt::nn::QkvProjection::bias_grads", Kokkos::RangePolicy<Exec>(exec, 0, Cl), KOKKOS_LAMBDA(std::int64_t j) {
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
  /// With `sequence_parallel`, x is this rank's N/tp rows (gathered over tp) and dx too.
  QkvProjection(const Mesh<Backend>& mesh, std::size_t C, RngKey first, double init_std = 0.02,
                bool sequence_parallel = false)
      : m_tp(mesh.comm(Axis::tp)), m_C(C), m_seq(sequence_parallel && m_tp.size() > 1) {
    const auto tp = static_cast<std::size_t>(m_tp.size()), r = static_cast<std::size_t>(m_tp.rank());
    pmt::detail::require(C % tp == 0, "pmt::nn::QkvProjection",
                         [&] { return pmt::detail::str("width ", C, " is not divisible by tp = ", tp); });
    const std::size_t Cl = C / tp;
    GlobalSlice ws;
    ws.extent[0] = 3 * C, ws.extent[1] = C, ws.offset[1] = r * Cl;
    m_w = Parameter<T, Exec>("pmt::nn::QkvProjection::weight", {3 * C, Cl}, ws, false);
    // part g (C, C) of the global weight, this rank's columns, into rows 3 i + g
    Tensor<T, 2, Exec> part("pmt::nn::QkvProjection::init", C, Cl);
    GlobalSlice ps;
    ps.extent[0] = C, ps.extent[1] = C, ps.offset[1] = r * Cl;
    const auto w3 =
        Kokkos::View<T***, Kokkos::LayoutRight, typename Exec::memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(
            m_w.value.data(), C, 3, Cl);
    for (std::uint32_t g = 0; g < 3; ++g) {
      fill_normal(Exec(), part, RngKey{first.seed, first.stream + g}, 0.0, init_std, ps);
      Kokkos::deep_copy(Exec(), Kokkos::subview(w3, Kokkos::ALL, g, Kokkos::ALL), part);
    }
    GlobalSlice bs;
    bs.extent[0] = C, bs.offset[0] = r * Cl;
    m_bq   = Parameter<T, Exec>("pmt::nn::QkvProjection::bias_q", {Cl}, bs, false);
    m_bv   = Parameter<T, Exec>("pmt::nn::QkvProjection::bias_v", {Cl}, bs, false);
    m_sums = Tensor<T, 1, Exec>("pmt::nn::QkvProjection::column_sums", 3 * Cl);
    Exec().fence();
  }

  /// \brief qkv (N, 3 Cl) = x W + [bq | 0 | bv]; keeps x for backward. With sequence
  /// parallelism x is (N/tp, C).
  Tensor<T, 2, Exec> forward(const Exec& exec, const Tensor<T, 2, Exec>& x_in) {
    pmt::detail::require(x_in.extent(1) == m_C, "pmt::nn::QkvProjection::forward",
                         [&] { return pmt::detail::str("x is ", shape_str(x_in), "; expected (N, ", m_C, ")"); });
    const Instrument instrument("pmt::nn::QkvProjection::forward");
    if (step_context().grad) *m_x = x_in;
    const Tensor<T, 2, Exec> x = m_seq ? parallel::gather_rows(m_tp, exec, x_in) : x_in;
    auto y = workspace_view<Tensor<T, 2, Exec>>("pmt::nn::QkvProjection::y", x.extent(0), 3 * local());
    pmt::detail::fill_qkv_bias(exec, y, m_bq.value, m_bv.value);
    ops::matmul(exec, ops::Trans::N, ops::Trans::N, T(1), x, weight(m_w.value), T(1), y);
    return y;
  }
  /// \brief dW += x^T dqkv, dbq and dbv += column sums, returns dx = dqkv W^T summed over tp
  /// (reduce-scattered to this rank's rows with sequence parallelism).
  Tensor<T, 2, Exec> backward(const Exec& exec, const Tensor<T, 2, Exec>& dy) {
    const Instrument instrument("pmt::nn::QkvProjection::backward");
    const Tensor<T, 2, Exec> saved = m_x.take();
    const std::size_t rows         = saved.extent(0) * (m_seq ? static_cast<std::size_t>(m_tp.size()) : 1);
    pmt::detail::require(saved.data() != nullptr && dy.extent(0) == rows && dy.extent(1) == 3 * local(),
                         "pmt::nn::QkvProjection::backward", [&] {
                           return pmt::detail::str("dqkv is ", shape_str(dy), " but forward saw x ", shape_str(saved),
                                                   " and produced (", rows, ", ", 3 * local(),
                                                   "); call forward first (each backward consumes its "
                                                   "forward's saved input)");
                         });
    const Tensor<T, 2, Exec> x = m_seq ? parallel::gather_rows(m_tp, exec, saved) : saved;
    ops::matmul(exec, ops::Trans::T, ops::Trans::N, T(1), x, dy, T(1), weight(m_w.grad));  // (C, 3 Cl)
    ops::column_sum(exec, dy, m_sums, T(0));
    pmt::detail::add_qkv_bias_grads(exec, m_sums, m_bq.grad, m_bv.grad);
    auto dx = workspace_view<Tensor<T, 2, Exec>>("pmt::nn::QkvProjection::dx", dy.extent(0), m_C);
    ops::matmul(exec, ops::Trans::N, ops::Trans::T, T(1), dy, weight(m_w.value), T(0), dx);  // (N, C)
    if (m_seq) return parallel::reduce_scatter_rows(m_tp, exec, dx);                         // conjugate of gather_rows
    parallel::copy_to_backward(m_tp, exec, dx);  // x entered the column-split region whole
    return dx;
  }
  std::vector<Parameter<T, Exec>*> parameters() { return {&m_w, &m_bq, &m_bv}; }
  /// \brief Sequence parallelism on or off from the next forward on (not between a forward and
  /// its backward).
  void sequence_parallel(bool on) noexcept { m_seq = on && m_tp.size() > 1; }
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
  bool m_seq;
  Parameter<T, Exec> m_w, m_bq, m_bv;
  Tensor<T, 1, Exec> m_sums;      // column sums of dqkv (3 Cl)
  Saved<Tensor<T, 2, Exec>> m_x;  // the input, per activation slot
};

/// \brief Multi-head causal self-attention with the heads split over tp (see the file comment):
/// x (B T, C) replicated -> y (B T, C) replicated; one all-reduce forward and one backward.
/// With `sequence_parallel` x and y are this rank's B T / tp rows (see the file comment).
/// \throws pmt::ShapeError when C is not divisible by the heads or the heads by tp, or an input
/// is not (B T, C).
template <class T, class Exec = Kokkos::DefaultExecutionSpace, class Backend = comm::default_backend_t<Exec>>
class CausalSelfAttention {
 public:
  using value_type                = T;
  using execution_space           = Exec;
  using input_placement           = Replicated;
  using output_placement          = Replicated;
  static constexpr bool nonlinear = true;

  /// Weights use RNG streams first_stream .. first_stream + 3 (q, k, v, proj).
  /// \throws pmt::ShapeError when C is not divisible by H or H by tp.
  CausalSelfAttention(const Mesh<Backend>& mesh, std::size_t C, std::size_t H, std::uint64_t seed,
                      std::uint32_t first_stream, bool sequence_parallel = false)
      : m_tp(mesh.comm(Axis::tp)),
        m_C(C),
        m_H(H),
        m_seq(sequence_parallel && m_tp.size() > 1),
        m_qkv(checked(mesh, C, H), C, RngKey{seed, first_stream}, 0.02, sequence_parallel),
        m_proj(mesh, C, C, RngKey{seed, first_stream + 3}, seq_options(sequence_parallel)) {}

  /// \brief y (N, C) from x (N, C) holding B sequences of T tokens (N/tp rows of each with
  /// sequence parallelism).
  Tensor<T, 2, Exec> forward(const Exec& exec, const Tensor<T, 2, Exec>& x, std::size_t B, std::size_t Tn) {
    const std::size_t rows =
        m_seq ? parallel::local_rows(m_tp, B * Tn, "pmt::nn::CausalSelfAttention::forward") : B * Tn;
    pmt::detail::require(x.extent(0) == rows && x.extent(1) == m_C, "pmt::nn::CausalSelfAttention::forward", [&] {
      return pmt::detail::str("x is ", shape_str(x), "; expected (B T", m_seq ? " / tp" : "", ", C) = (", rows, ", ",
                              m_C, ")");
    });
    const Instrument instrument("pmt::nn::CausalSelfAttention::forward");
    const std::size_t Cl = m_C / static_cast<std::size_t>(m_tp.size());
    // pmt::NoGrad / KeepNothing: the buffers come from the workspace and go back after this
    // forward, so every layer's no-grad forward (recomputation's first pass, evaluation) reuses
    // the same ones instead of each layer holding its own
    // (with selective recomputation only the projection's output is kept, so the attention's
    // buffers are such a scratch too)
    Cache scratch;
    Cache& saved = step_context().grad && !m_recompute ? *m_saved : scratch;
    if (saved.cache.B != static_cast<std::int64_t>(B) || saved.cache.T_ != static_cast<std::int64_t>(Tn))
      saved.cache = make_cache(B, Tn);
    auto qkv = m_qkv.forward(exec, x);  // (N, 3 C/tp) = [q | k | v]
    auto att = workspace_view<Tensor<T, 2, Exec>>("pmt::nn::attention::out", B * Tn, Cl);
    ops::attention_forward(exec, as3(qkv, B, Tn), as3(att, B, Tn), saved.cache);
    if (step_context().grad && m_recompute)
      m_saved->qkv = qkv, m_saved->cache.B = saved.cache.B, m_saved->cache.T_ = saved.cache.T_;
    return m_proj.forward(exec, att);  // (N, C), all-reduced over tp (N/tp rows, reduce-scattered)
  }

  /// \brief dx (N, C) from dy (N, C).
  Tensor<T, 2, Exec> backward(const Exec& exec, const Tensor<T, 2, Exec>& dy) {
    const Instrument instrument("pmt::nn::CausalSelfAttention::backward");
    auto saved   = m_saved.take();
    const auto B = static_cast<std::size_t>(saved.cache.B), Tn = static_cast<std::size_t>(saved.cache.T_);
    const std::size_t rows = m_seq ? B * Tn / static_cast<std::size_t>(m_tp.size()) : B * Tn;
    pmt::detail::require((saved.cache.q.data() != nullptr || saved.qkv.data() != nullptr) && dy.extent(0) == rows,
                         "pmt::nn::CausalSelfAttention::backward", [&] {
                           return pmt::detail::str("dy is ", shape_str(dy), " but the saved forward is (B T",
                                                   m_seq ? " / tp" : "", ", C) = (", rows, ", ", m_C,
                                                   "); call forward first (each backward consumes its "
                                                   "forward's activations)");
                         });
    const std::size_t Cl = m_C / static_cast<std::size_t>(m_tp.size());
    auto datt            = m_proj.backward(exec, dy);  // (N, C/tp)
    if (saved.qkv.data() != nullptr) {                 // selective recomputation: the attention's forward again
      const Instrument again("pmt::nn::CausalSelfAttention::recompute");
      saved.cache = make_cache(B, Tn);
      auto att    = workspace_view<Tensor<T, 2, Exec>>("pmt::nn::attention::out", B * Tn, Cl);
      ops::attention_forward(exec, as3(saved.qkv, B, Tn), as3(att, B, Tn), saved.cache);
    }
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
  /// \brief Selective recomputation on or off from the next forward on (see the file comment).
  void recompute_attention(bool on) noexcept { m_recompute = on; }
  bool recomputes_attention() const noexcept { return m_recompute; }
  /// \brief Sequence parallelism on or off from the next forward on (not between a forward and
  /// its backward).
  void sequence_parallel(bool on) {
    m_seq = on && m_tp.size() > 1;
    m_qkv.sequence_parallel(on), m_proj.sequence_parallel(on);
  }

 private:
  static const Mesh<Backend>& checked(const Mesh<Backend>& mesh, std::size_t C, std::size_t H) {
    const auto tp = static_cast<std::size_t>(mesh.degree(Axis::tp));
    pmt::detail::require(H > 0 && C % H == 0, "pmt::nn::CausalSelfAttention",
                         [&] { return pmt::detail::str("width ", C, " is not divisible by heads ", H); });
    pmt::detail::require(H % tp == 0, "pmt::nn::CausalSelfAttention", [&] {
      return pmt::detail::str("heads ", H, " are not divisible by tp = ", tp, " (heads are split over tp)");
    });
    return mesh;
  }
  ops::AttentionCache<T, Exec> make_cache(std::size_t B, std::size_t Tn) const {
    const auto tp = static_cast<std::size_t>(m_tp.size());
    return ops::make_attention_cache<T, Exec>(static_cast<std::int64_t>(B), static_cast<std::int64_t>(Tn),
                                              static_cast<std::int64_t>(m_C / tp), static_cast<std::int64_t>(m_H / tp));
  }
  static LinearOptions seq_options(bool sequence_parallel) {
    LinearOptions o;
    o.sequence_parallel = sequence_parallel;
    return o;
  }
  static auto as3(const Tensor<T, 2, Exec>& v, std::size_t B, std::size_t Tn) {
    return Kokkos::View<T***, Kokkos::LayoutRight, typename Exec::memory_space,
                        Kokkos::MemoryTraits<Kokkos::Unmanaged>>(v.data(), B, Tn, v.extent(1));
  }

  comm::Communicator<Backend> m_tp;
  std::size_t m_C, m_H;
  bool m_seq;
  QkvProjection<T, Exec, Backend> m_qkv;
  Linear<T, TensorSplit<Row>, Exec, Backend> m_proj;
  bool m_recompute = false;  // selective recomputation
  struct Cache {
    ops::AttentionCache<T, Exec> cache;  // its B and T_ also with selective recomputation
    Tensor<T, 2, Exec> qkv;              // selective recomputation: [q | k | v] (N, 3 Cl)
  };
  Saved<Cache> m_saved;  // per activation slot
};

}  // namespace pmt::nn
