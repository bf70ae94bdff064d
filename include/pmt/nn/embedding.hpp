// SPDX-License-Identifier: Apache-2.0
#pragma once
// Embedding<T, Exec>: a lookup table (V, C), either split over tp along the vocabulary (token
// embeddings, Megatron's vocab-parallel embedding) or replicated (position embeddings).
//   split:      rank i holds rows [i V/tp, (i+1) V/tp); ids it does not hold give zeros, then
//               out is all-reduced over tp. Forward: all_reduce(tp) of out; backward: none.
//   replicated: out = table(ids). Communication: none.
// Ids are checked against [0, V) (one fence). V not divisible by tp raises (pad the vocabulary
// yourself: pmt never pads silently). Gradients accumulate into the table's grad.

#include "pmt/comm/backend.hpp"
#include "pmt/comm/mesh.hpp"
#include "pmt/core/activation_slot.hpp"
#include "pmt/core/error.hpp"
#include "pmt/core/instrument.hpp"
#include "pmt/core/random.hpp"
#include "pmt/core/tensor.hpp"
#include "pmt/core/workspace.hpp"
#include "pmt/nn/module.hpp"
#include "pmt/ops/elementwise.hpp"
#include "pmt/ops/embedding.hpp"
#include "pmt/parallel/regions.hpp"

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace pmt::nn {

/// \brief Whether an Embedding splits its vocabulary over tp.
enum class VocabSplit { No, Yes };

/// \brief A lookup table (V, C): ids (N) -> x (N, C) replicated. With VocabSplit::Yes each tp rank
/// holds V / tp rows and the looked-up rows are all-reduced over tp (see the file comment).
/// \throws pmt::ShapeError for ids outside [0, V) (naming how many) or V not divisible by tp.
template <class T, class Exec = Kokkos::DefaultExecutionSpace, class Backend = comm::default_backend_t<Exec>>
class Embedding {
 public:
  using value_type = T;
  using Ids        = Kokkos::View<std::int32_t*, Kokkos::LayoutRight, typename Exec::memory_space>;

  Embedding(const Mesh<Backend>& mesh, const std::string& name, std::size_t V, std::size_t C, RngKey key,
            VocabSplit split, double init_std = 0.02)
      : m_tp(mesh.comm(Axis::tp)), m_V(V), m_split(split == VocabSplit::Yes && m_tp.size() > 1) {
    const auto tp = static_cast<std::size_t>(m_tp.size());
    if (split == VocabSplit::Yes)
      pmt::detail::require(V % tp == 0, "pmt::nn::Embedding", [&] {
        return pmt::detail::str(name, ": vocabulary size ", V, " is not divisible by tp = ", tp,
                                "; pad the vocabulary to a multiple of tp");
      });
    const std::size_t Vl = m_split ? V / tp : V;
    m_v0                 = m_split ? static_cast<std::int64_t>(Vl) * m_tp.rank() : 0;
    GlobalSlice s;
    s.extent[0] = V, s.extent[1] = C, s.offset[0] = static_cast<std::uint64_t>(m_v0);
    m_table = Parameter<T, Exec>(name + "::table", {Vl, C}, s, !m_split);
    fill_normal(Exec(), m_table.value2d(), key, 0.0, init_std, s);
    Exec().fence();  // initialised for any instance, like a freshly allocated View
  }

  /// \brief out (N, C) = table(ids) (all-reduced over tp when split); `accumulate` adds to out.
  /// \throws pmt::ShapeError when an id lies outside [0, V).
  void forward(const Exec& exec, const Ids& ids, const Tensor<T, 2, Exec>& out, bool accumulate = false) {
    const Instrument instrument("pmt::nn::Embedding::forward");
    const auto V          = static_cast<std::int64_t>(m_V);
    const std::int64_t v0 = m_v0, vl = static_cast<std::int64_t>(m_table.local_shape[0]);
    auto& saved = *m_local;
    if (saved.extent(0) != ids.extent(0)) saved = workspace_view<Ids>("pmt::nn::Embedding::local_ids", ids.extent(0));
    auto local       = saved;
    std::int64_t bad = 0;
    Kokkos::parallel_reduce(
        "pmt::nn::Embedding::local_ids", Kokkos::RangePolicy<Exec>(exec, 0, ids.extent(0)),
        KOKKOS_LAMBDA(std::int64_t n, std::int64_t & acc) {
          const std::int64_t id = ids(n);
          if (id < 0 || id >= V) ++acc;
          local(n) = (id >= v0 && id < v0 + vl) ? static_cast<std::int32_t>(id - v0) : -1;
        },
        bad);
    pmt::detail::require(bad == 0, "pmt::nn::Embedding::forward", [&] {
      return pmt::detail::str(m_table.name, ": ", bad, " of ", ids.extent(0), " ids lie outside [0, ", m_V, ")");
    });
    if (m_split && accumulate) {  // the all-reduce must see only this layer's contribution
      Tensor<T, 2, Exec> part("pmt::nn::Embedding::part", out.extent(0), out.extent(1));
      ops::embedding(exec, local, m_table.value2d(), part, ops::Accumulate::No, -1);
      parallel::reduce_from(m_tp, exec, part);
      ops::axpy(exec, T(1), part, out);
      return;
    }
    ops::embedding(exec, local, m_table.value2d(), out, accumulate ? ops::Accumulate::Yes : ops::Accumulate::No, -1);
    if (m_split) parallel::reduce_from(m_tp, exec, out);
  }

  /// \brief table.grad(ids(n) - v0, :) += dout(n, :) for the ids this rank holds.
  void backward(const Exec& exec, const Tensor<T, 2, Exec>& dout) {
    const Instrument instrument("pmt::nn::Embedding::backward");
    ops::embedding_backward(exec, m_local.take(), dout, m_table.grad2d(), -1);
  }

  Parameter<T, Exec>& table() { return m_table; }
  std::int64_t vocab_offset() const noexcept { return m_v0; }
  std::size_t vocab() const noexcept { return m_V; }
  std::vector<Parameter<T, Exec>*> parameters() { return {&m_table}; }

 private:
  comm::Communicator<Backend> m_tp;
  std::size_t m_V;
  bool m_split;
  std::int64_t m_v0 = 0;
  Parameter<T, Exec> m_table;
  Saved<Ids> m_local;  // this rank's local ids, per activation slot
};

}  // namespace pmt::nn
