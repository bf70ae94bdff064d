// SPDX-License-Identifier: Apache-2.0
#pragma once
// Gpt<T, Exec>: a GPT-2 style language model. Token embedding (vocab-parallel over tp) + learned
// positions -> `layers` pre-LN blocks (x + attn(ln1(x)), then x + mlp(ln2(x))) -> final LayerNorm
// -> LM head tied to the token embedding (logits stay split over the vocabulary) -> vocab-parallel
// cross-entropy. Legend: B batch, T context, N = B T, C width, V vocabulary, tp degree.
//   ids (N) -> x (N, C) -> ... -> h (N, C) -> logits (N, V/tp) -> loss
// The same source runs on every tp degree and execution space; with tp = 1 no communication
// happens. Parameters draw from RNG streams fixed per parameter, keyed by global index.

#include "pmt/comm/backend.hpp"
#include "pmt/comm/collectives.hpp"
#include "pmt/comm/mesh.hpp"
#include "pmt/core/error.hpp"
#include "pmt/core/random.hpp"
#include "pmt/core/tensor.hpp"
#include "pmt/nn/attention.hpp"
#include "pmt/nn/embedding.hpp"
#include "pmt/nn/layernorm.hpp"
#include "pmt/nn/loss.hpp"
#include "pmt/nn/mlp.hpp"
#include "pmt/nn/module.hpp"
#include "pmt/ops/elementwise.hpp"
#include "pmt/ops/matmul.hpp"

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace pmt::nn {

/// \brief The shape of a Gpt and its initialisation seed.
struct GptConfig {
  std::size_t vocab = 256, context = 64, layers = 2, width = 64, heads = 4;
  std::uint64_t seed = 1234;
};

/// \brief One pre-LN transformer block.
template <class T, class Exec, class Backend>
class GptBlock {
 public:
  GptBlock(const Mesh<Backend>& mesh, const GptConfig& c, std::size_t index)
      : m_ln1("block" + std::to_string(index) + ".ln1", c.width),
        m_attn(mesh, c.width, c.heads, c.seed, stream(index, 0)),
        m_ln2("block" + std::to_string(index) + ".ln2", c.width),
        m_mlp(make_mlp<T, Exec, Backend>(mesh, c.width, 4 * c.width, c.seed, stream(index, 4))) {}

  Tensor<T, 2, Exec> forward(const Exec& exec, const Tensor<T, 2, Exec>& x, std::size_t B, std::size_t Tn) {
    auto h = m_attn.forward(exec, m_ln1.forward(exec, x), B, Tn);
    ops::add(exec, x, h, h);                                     // h = x + attn(ln1(x))
    auto y = m_mlp.forward(exec, m_ln2.forward(exec, h));
    ops::add(exec, h, y, y);                                     // y = h + mlp(ln2(h))
    return y;
  }
  Tensor<T, 2, Exec> backward(const Exec& exec, const Tensor<T, 2, Exec>& dy) {
    auto dh = m_ln2.backward(exec, m_mlp.backward(exec, dy));
    ops::add(exec, dh, dy, dh);                                  // residual
    auto dx = m_ln1.backward(exec, m_attn.backward(exec, dh));
    ops::add(exec, dx, dh, dx);
    return dx;
  }
  std::vector<Parameter<T, Exec>*> parameters() {
    std::vector<Parameter<T, Exec>*> all;
    for (const auto& v : {m_ln1.parameters(), m_attn.parameters(), m_ln2.parameters(), m_mlp.parameters()})
      all.insert(all.end(), v.begin(), v.end());
    return all;
  }

 private:
  static std::uint32_t stream(std::size_t index, std::uint32_t k) { return static_cast<std::uint32_t>(100 + 10 * index) + k; }
  LayerNorm<T, Exec> m_ln1;
  CausalSelfAttention<T, Exec, Backend> m_attn;
  LayerNorm<T, Exec> m_ln2;
  Mlp<T, Exec, Backend> m_mlp;
};

// ---------------------------------------------------------------------------------------------

/// \brief GPT language model spread over the tp axis of a Mesh (see the file comment).
/// \code
/// pmt::nn::Gpt<float, Kokkos::OpenMP> model(mesh, {/*vocab=*/256, /*context=*/128, /*layers=*/4, /*width=*/256, /*heads=*/4});
/// double loss = model.forward_backward(exec, ids, targets, B, T, /*normaliser=*/global_tokens);
/// \endcode
/// \throws pmt::ShapeError when heads, width or vocab do not divide by tp, or inputs do not fit.
template <class T, class Exec = Kokkos::DefaultExecutionSpace, class Backend = comm::default_backend_t<Exec>>
class Gpt {
 public:
  using value_type = T;
  using Ids        = typename Embedding<T, Exec, Backend>::Ids;

  Gpt(const Mesh<Backend>& mesh, const GptConfig& c)
      : m_cfg(c), m_tp(mesh.comm(Axis::tp)),
        m_wte(mesh, "wte", c.vocab, c.width, RngKey{c.seed, 0}, VocabSplit::Yes),
        m_wpe(mesh, "wpe", c.context, c.width, RngKey{c.seed, 1}, VocabSplit::No, 0.01),
        m_lnf("lnf", c.width) {
    detail::require(c.vocab > 0 && c.context > 0 && c.layers > 0 && c.width > 0 && c.heads > 0, "pmt::nn::Gpt", [&] {
      return detail::str("vocab ", c.vocab, ", context ", c.context, ", layers ", c.layers, ", width ", c.width,
                         ", heads ", c.heads, ": every size must be positive");
    });
    for (std::size_t i = 0; i < c.layers; ++i) m_blocks.push_back(std::make_unique<GptBlock<T, Exec, Backend>>(mesh, c, i));
  }

  /// \brief Forward and backward of one batch: ids and targets (B T) of this rank's data shard.
  /// Returns this batch's loss divided by `normaliser` (pass the global token count so that
  /// ranks' and microbatches' losses add up to the global mean); gradients accumulate.
  double forward_backward(const Exec& exec, const Ids& ids, const Ids& targets, std::size_t B, std::size_t Tn,
                          double normaliser, std::int64_t ignore_index = -100) {
    detail::require(ids.extent(0) == B * Tn && targets.extent(0) == B * Tn && Tn <= m_cfg.context, "pmt::nn::Gpt",
                    [&] {
                      return detail::str("ids is ", shape_str(ids), " and targets ", shape_str(targets), " for B = ", B,
                                         ", T = ", Tn, "; expected (B T) each and T <= context ", m_cfg.context);
                    });
    const std::size_t N = B * Tn, C = m_cfg.width;
    if (m_pos.extent(0) != N) {
      m_pos = Ids("pmt::nn::Gpt::positions", N);
      auto pos = m_pos;
      Kokkos::parallel_for("pmt::nn::Gpt::positions", Kokkos::RangePolicy<Exec>(exec, 0, N),
                           KOKKOS_LAMBDA(std::size_t n) { pos(n) = static_cast<std::int32_t>(n % Tn); });
    }
    Tensor<T, 2, Exec> x(Kokkos::view_alloc(Kokkos::WithoutInitializing, "pmt::nn::Gpt::x"), N, C);  // overwritten
    m_wte.forward(exec, ids, x);
    m_wpe.forward(exec, m_pos, x, /*accumulate=*/true);
    for (auto& b : m_blocks) x = b->forward(exec, x, B, Tn);
    auto h = m_lnf.forward(exec, x);
    // Tied LM head: logits (N, V/tp) = h wte_shard^T.
    auto table = m_wte.table().value2d();
    Tensor<T, 2, Exec> logits(Kokkos::view_alloc(Kokkos::WithoutInitializing, "pmt::nn::Gpt::logits"), N, table.extent(0));
    ops::matmul(exec, ops::Trans::N, ops::Trans::T, T(1), h, table, T(0), logits);
    Tensor<T, 2, Exec> dlogits(Kokkos::view_alloc(Kokkos::WithoutInitializing, "pmt::nn::Gpt::dlogits"), N, table.extent(0));
    const double loss = vocab_parallel_cross_entropy(m_tp, exec, logits, targets, m_wte.vocab_offset(),
                                                     static_cast<std::int64_t>(m_cfg.vocab), normaliser, dlogits, ignore_index);
    // Backward of the head: dh = dlogits wte_shard (partial over the vocabulary: all-reduce),
    // d wte_shard += dlogits^T h.
    Tensor<T, 2, Exec> dh(Kokkos::view_alloc(Kokkos::WithoutInitializing, "pmt::nn::Gpt::dh"), N, C);
    ops::matmul(exec, ops::Trans::N, ops::Trans::N, T(1), dlogits, table, T(0), dh);
    comm::all_reduce(m_tp, exec, dh);
    ops::matmul(exec, ops::Trans::T, ops::Trans::N, T(1), dlogits, h, T(1), m_wte.table().grad2d());
    auto dx = m_lnf.backward(exec, dh);
    for (auto it = m_blocks.rbegin(); it != m_blocks.rend(); ++it) {
      dx = (*it)->backward(exec, dx);
      if (m_on_block_grads) m_on_block_grads((*it)->parameters());
    }
    m_wpe.backward(exec, dx);
    m_wte.backward(exec, dx);
    return loss;
  }

  /// \brief Called during backward with each block's parameters once their gradients are final
  /// (data-parallel gradient sync starts its all-reduces there, overlapping backward).
  void on_block_grads(std::function<void(const std::vector<Parameter<T, Exec>*>&)> hook) {
    m_on_block_grads = std::move(hook);
  }

  /// \brief Every parameter, in a fixed order (embeddings, blocks, final norm).
  std::vector<Parameter<T, Exec>*> parameters() {
    std::vector<Parameter<T, Exec>*> all{&m_wte.table(), &m_wpe.table()};
    for (auto& b : m_blocks)
      for (auto* p : b->parameters()) all.push_back(p);
    for (auto* p : m_lnf.parameters()) all.push_back(p);
    return all;
  }
  const GptConfig& config() const noexcept { return m_cfg; }

 private:
  GptConfig m_cfg;
  comm::Communicator<Backend> m_tp;
  Embedding<T, Exec, Backend> m_wte, m_wpe;
  std::vector<std::unique_ptr<GptBlock<T, Exec, Backend>>> m_blocks;
  LayerNorm<T, Exec> m_lnf;
  Ids m_pos;
  std::function<void(const std::vector<Parameter<T, Exec>*>&)> m_on_block_grads;
};

}  // namespace pmt::nn
