// SPDX-License-Identifier: Apache-2.0
#pragma once
// CausalSelfAttention<T, Exec>: multi-head causal self-attention with the heads split over tp.
// q, k and v are Linear<Col> (C -> C/tp: this rank's H/tp heads), the output projection is
// Linear<Row> (C/tp -> C). Legend: B batch, T sequence, N = B T rows, C width, H heads, tp degree.
//   x (N, C) -> q, k, v (N, C/tp) -> attention (B, T, C/tp) -> proj (N, C)
// Communication: forward one all_reduce(tp) (proj); backward one (the summed dx of q, k, v).
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

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace pmt::nn {

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
        m_q(checked(mesh, C, H), C, C, RngKey{seed, first_stream}),
        m_k(mesh, C, C, RngKey{seed, first_stream + 1}, LinearOptions{/*bias=*/false}),
        m_v(mesh, C, C, RngKey{seed, first_stream + 2}),
        m_proj(mesh, C, C, RngKey{seed, first_stream + 3}) {}

  /// \brief y (N, C) from x (N, C) holding B sequences of T tokens.
  Tensor<T, 2, Exec> forward(const Exec& exec, const Tensor<T, 2, Exec>& x, std::size_t B, std::size_t Tn) {
    detail::require(x.extent(0) == B * Tn && x.extent(1) == m_C, "pmt::nn::CausalSelfAttention::forward", [&] {
      return detail::str("x is ", shape_str(x), "; expected (B T, C) = (", B * Tn, ", ", m_C, ")");
    });
    const Instrument instrument("pmt::nn::CausalSelfAttention::forward");
    const std::size_t Cl = m_C / static_cast<std::size_t>(m_tp.size()), Hl = m_H / static_cast<std::size_t>(m_tp.size());
    auto& saved = *m_saved;
    if (saved.cache.B != static_cast<std::int64_t>(B) || saved.cache.T_ != static_cast<std::int64_t>(Tn))
      saved.cache = ops::make_attention_cache<T, Exec>(static_cast<std::int64_t>(B), static_cast<std::int64_t>(Tn),
                                                   static_cast<std::int64_t>(Cl), static_cast<std::int64_t>(Hl));
    auto q = m_q.forward(exec, x), k = m_k.forward(exec, x), v = m_v.forward(exec, x);  // (N, C/tp) each
    Tensor<T, 2, Exec> att(Kokkos::view_alloc(Kokkos::WithoutInitializing, "pmt::nn::attention::out"), B * Tn, Cl);
    ops::attention_forward(exec, as3(q, B, Tn), as3(k, B, Tn), as3(v, B, Tn), as3(att, B, Tn), saved.cache);
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
    const auto uninit = [](const char* label) { return Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)); };
    Tensor<T, 2, Exec> dq(uninit("pmt::nn::attention::dq"), B * Tn, Cl), dk(uninit("pmt::nn::attention::dk"), B * Tn, Cl),
        dv(uninit("pmt::nn::attention::dv"), B * Tn, Cl);  // every element written by attention_backward
    ops::attention_backward(exec, as3(datt, B, Tn), as3(dq, B, Tn), as3(dk, B, Tn), as3(dv, B, Tn), saved.cache);
    auto dx = m_q.backward(exec, dq, /*reduce_dx=*/false);
    m_k.backward_accumulate(exec, dk, dx);  // dx += dk Wk^T
    m_v.backward_accumulate(exec, dv, dx);
    parallel::copy_to_backward(m_tp, exec, dx);  // one all-reduce for the three Col layers
    return dx;
  }

  std::vector<Parameter<T, Exec>*> parameters() {
    std::vector<Parameter<T, Exec>*> all;
    for (auto* l : {&m_q, &m_k, &m_v})
      for (auto* p : l->parameters()) all.push_back(p);
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
  Linear<T, TensorSplit<Col>, Exec, Backend> m_q, m_k, m_v;
  Linear<T, TensorSplit<Row>, Exec, Backend> m_proj;
  struct Cache {
    ops::AttentionCache<T, Exec> cache;
  };
  Saved<Cache> m_saved;  // per activation slot
};

}  // namespace pmt::nn
