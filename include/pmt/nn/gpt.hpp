// SPDX-License-Identifier: Apache-2.0
#pragma once
// Gpt<T, Exec>: a GPT-2 style language model. Token embedding (vocab-parallel over tp) + learned
// positions -> `layers` pre-LN blocks (x + attn(ln1(x)), then x + mlp(ln2(x))) -> final LayerNorm
// -> LM head tied to the token embedding (logits stay split over the vocabulary) -> vocab-parallel
// cross-entropy. Legend: B batch, T context, N = B T, C width, V vocabulary, tp/pp degrees.
//   ids (N) -> x (N, C) -> ... -> h (N, C) -> logits (N, V/tp) -> loss
// The same source runs on every tp and pp degree and execution space; with tp = pp = 1 no
// communication happens. Parameters draw from RNG streams fixed per parameter, keyed by global
// index, so every layout holds slices of the one-rank model's values.
// Pipeline stages (the pp axis of the Mesh): stage s holds the blocks of its StagePlan range; the
// first stage also the embeddings, the last the final norm and the LM head. With pp > 1 the last
// stage keeps its own copy of the tied embedding table (marked pp_copy); tied_parameters() names
// it, and parallel::finalize_grads sums the two copies' gradients between the first and last
// stage (as Megatron does), so both take the same optimizer step and stay equal. Gpt is a stage
// module (parallel/stage_module.hpp): forward_chunk / backward_chunk run one microbatch of one
// chunk in the current activation slot (core/activation_slot.hpp); the pipeline runner calls them.
// Model chunks (interleaved pipeline schedules): with `chunks` = v the plan cuts the blocks into
// v pp virtual stages and stage s holds v of them, s, pp + s, ..., (v-1) pp + s; forward_chunk /
// backward_chunk run one of them. The first stage still holds the embeddings (in chunk 0) and
// the last the final norm and LM head (in chunk v-1).
// Parameter names are global and layout-free: "wte", "wpe", "block3.attn.2", "lnf.weight".
// Sequence parallelism (GptOptions::sequence_parallel, Megatron's): with tp > 1 the activations
// between the tensor-parallel regions (the norms and residual adds, what a stage sends and
// receives) are this rank's N/tp rows of the B T tokens, rows [r N/tp, (r+1) N/tp) on tp rank r.
// The Col layers all-gather their input and the Row layers reduce-scatter their output in place
// of the all-reduces (parallel/regions.hpp); the embeddings' output is split after the lookup,
// and the LM head all-gathers the final norm's output and reduce-scatters its gradient. The
// norms' weights and the Row layers' biases then hold each rank's rows' part of their gradient
// (Parameter::tp_partial); parallel::sum_partial_grads sums them over tp (the Trainer does, after
// the data-parallel sync). B T must divide by tp.

#include "pmt/comm/backend.hpp"
#include "pmt/comm/mesh.hpp"
#include "pmt/core/activation_slot.hpp"
#include "pmt/core/error.hpp"
#include "pmt/core/instrument.hpp"
#include "pmt/core/progress.hpp"
#include "pmt/core/random.hpp"
#include "pmt/core/step_context.hpp"
#include "pmt/core/tensor.hpp"
#include "pmt/core/workspace.hpp"
#include "pmt/nn/attention.hpp"
#include "pmt/nn/embedding.hpp"
#include "pmt/nn/gpt_config.hpp"
#include "pmt/nn/layernorm.hpp"
#include "pmt/nn/loss.hpp"
#include "pmt/nn/mlp.hpp"
#include "pmt/nn/module.hpp"
#include "pmt/ops/elementwise.hpp"
#include "pmt/ops/matmul.hpp"
#include "pmt/parallel/regions.hpp"
#include "pmt/parallel/stage_module.hpp"
#include "pmt/parallel/stages.hpp"
#include "pmt/policy/hybrid.hpp"

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace pmt::nn {

/// \brief One pre-LN transformer block.
template <class T, class Exec, class Backend>
class GptBlock {
 public:
  /// With `sequence_parallel` (and tp > 1) x and y are this rank's N/tp rows (see Gpt).
  GptBlock(const Mesh<Backend>& mesh, const GptConfig& c, std::size_t index, bool sequence_parallel = false)
      : m_ln1("block" + std::to_string(index) + ".ln1", c.width),
        m_attn(mesh, c.width, c.heads, c.seed, stream(index, 0), sequence_parallel),
        m_ln2("block" + std::to_string(index) + ".ln2", c.width),
        m_mlp(make_mlp<T, Exec, Backend>(mesh, c.width, 4 * c.width, c.seed, stream(index, 4), sequence_parallel)) {
    if (sequence_parallel && mesh.degree(Axis::tp) > 1)
      for (const auto& ps : {m_ln1.parameters(), m_ln2.parameters()})
        for (auto* p : ps) p->tp_partial = true;
  }

  /// \brief y (N, C) from x (N, C) holding B sequences of T tokens. With recomputation (and
  /// gradients enabled) only x is kept; backward runs this forward again first.
  Tensor<T, 2, Exec> forward(const Exec& exec, const Tensor<T, 2, Exec>& x, std::size_t B, std::size_t Tn) {
    const Instrument instrument("pmt::nn::GptBlock::forward");
    if (m_recompute && step_context().grad) {
      *m_replay = {x, B, Tn};
      const KeepNothing nothing_kept;
      return compute(exec, x, B, Tn);
    }
    return compute(exec, x, B, Tn);
  }
  Tensor<T, 2, Exec> backward(const Exec& exec, const Tensor<T, 2, Exec>& dy) {
    const Instrument instrument("pmt::nn::GptBlock::backward");
    if (m_recompute) {  // the forward again, keeping its activations this time
      const Replay r = m_replay.take();
      pmt::detail::require(r.x.data() != nullptr, "pmt::nn::GptBlock::backward", [] {
        return std::string("no forward ran in this activation slot (each backward consumes its forward's input)");
      });
      const Instrument again("pmt::nn::GptBlock::recompute");
      compute(exec, r.x, r.B, r.Tn);
    }
    auto dh = m_ln2.backward(exec, m_mlp.backward(exec, dy));
    ops::add(exec, dh, dy, dh);  // residual
    pmt::progress();
    auto dx = m_ln1.backward(exec, m_attn.backward(exec, dh));
    ops::add(exec, dx, dh, dx);
    return dx;
  }
  /// \brief Activation recomputation on or off (see forward).
  void recompute(bool on) noexcept { m_recompute = on; }
  /// \brief Selective recomputation of the attention on or off (nn/attention.hpp).
  void recompute_attention(bool on) noexcept { m_attn.recompute_attention(on); }
  /// \brief Sequence parallelism of the block's layers on or off from the next forward on.
  void sequence_parallel(bool on) {
    m_attn.sequence_parallel(on);
    m_mlp.template get<0>().sequence_parallel(on), m_mlp.template get<2>().sequence_parallel(on);
  }
  std::vector<Parameter<T, Exec>*> parameters() {
    std::vector<Parameter<T, Exec>*> all;
    for (const auto& v : {m_ln1.parameters(), m_attn.parameters(), m_ln2.parameters(), m_mlp.parameters()})
      all.insert(all.end(), v.begin(), v.end());
    return all;
  }
  /// \brief Gives the parameters their global names ("block3.ln1.0", "block3.attn.2", ...).
  void name_parameters(std::size_t index) {
    const std::string b = "block" + std::to_string(index) + ".";
    nn::name_parameters(m_ln1.parameters(), b + "ln1"), nn::name_parameters(m_attn.parameters(), b + "attn");
    nn::name_parameters(m_ln2.parameters(), b + "ln2"), nn::name_parameters(m_mlp.parameters(), b + "mlp");
  }

 private:
  Tensor<T, 2, Exec> compute(const Exec& exec, const Tensor<T, 2, Exec>& x, std::size_t B, std::size_t Tn) {
    auto h = m_attn.forward(exec, m_ln1.forward(exec, x), B, Tn);
    ops::add(exec, x, h, h);  // h = x + attn(ln1(x))
    pmt::progress();          // pending pipeline messages move
    auto y = m_mlp.forward(exec, m_ln2.forward(exec, h));
    ops::add(exec, h, y, y);  // y = h + mlp(ln2(h))
    return y;
  }
  static std::uint32_t stream(std::size_t index, std::uint32_t k) {
    return static_cast<std::uint32_t>(100 + 10 * index) + k;
  }
  LayerNorm<T, Exec> m_ln1;
  CausalSelfAttention<T, Exec, Backend> m_attn;
  LayerNorm<T, Exec> m_ln2;
  Mlp<T, Exec, Backend> m_mlp;
  bool m_recompute = false;
  struct Replay {
    Tensor<T, 2, Exec> x;  // the block's input
    std::size_t B = 0, Tn = 0;
  };
  Saved<Replay> m_replay;  // with recomputation, per activation slot
};

// ---------------------------------------------------------------------------------------------

/// \brief How a Gpt is cut over pipeline stages and run.
struct GptOptions {
  parallel::StagePlan plan;  ///< blocks per virtual stage (pp * chunks of them); empty: balanced
  int chunks = 1;            ///< model chunks per stage (interleaved schedules); 1: none
  /// Activation recomputation per block: a block's forward keeps only its input (pmt::KeepNothing
  /// inside) and its backward runs the forward again first. The same gradients, bit for bit, for
  /// one more block forward per microbatch; a live microbatch holds one (N, C) tensor per block
  /// instead of every layer's activations and the attention matrices.
  bool recompute = false;
  /// Sequence parallelism (see the Gpt file comment): with tp > 1 the activations outside the
  /// tensor-parallel regions hold N/tp rows per rank, all-gathered and reduce-scattered around
  /// them. The same model and gradients (to rounding), less activation memory and smaller
  /// pipeline messages; B T must divide by tp.
  bool sequence_parallel = false;
  /// Selective recomputation (Megatron's): each block's attention keeps only [q | k | v] and its
  /// backward runs the attention core (q k^T, softmax, times v) again; the T x T matrices of a
  /// live microbatch are not kept. The same gradients bit for bit. Ignored with `recompute`, which
  /// recomputes the whole block.
  bool recompute_attention = false;
};

/// \brief `base` with what the policy fixes about activations for this rank (see
/// pmt::activation_policy): sequence_parallel on under TensorSplit<Sequence>; under
/// Recompute<What, Stages>, recompute (Full) or recompute_attention (Selective) on exactly where
/// this rank's pipeline stage recomputes, and off elsewhere. What the policy leaves open stays as
/// `base` has it. Build the model with it and the Trainer of the same policy finds them agreeing.
/// \code
/// using Par = pmt::Hybrid<pmt::DataParallel<>, pmt::TensorSplit<pmt::Sequence>, pmt::Pipeline<>,
/// pmt::Recompute<pmt::Selective>>; pmt::nn::Gpt<float, Kokkos::OpenMP> model(mesh, config,
/// pmt::nn::gpt_options<Par>(mesh)); \endcode
template <class Policy, class Backend>
GptOptions gpt_options(const Mesh<Backend>& mesh, GptOptions base = {}) {
  using A = activation_policy<Policy>;
  if constexpr (A::sequence_parallel) base.sequence_parallel = true;
  if constexpr (A::fixes_recompute) {
    const bool here          = A::recomputes_on(mesh.coord(Axis::pp));
    base.recompute           = A::full && here;
    base.recompute_attention = A::selective && here;
  }
  return base;
}

namespace detail {
/// pos(n) = n mod Tn: the position of each of N = B Tn tokens. A free function: CUDA's extended
/// lambdas may not sit in a class's private member functions.
template <class Exec, class Ids>
void fill_positions(const Exec& exec, const Ids& pos, std::size_t Tn) {
  Kokkos::parallel_for(
      "pmt::nn::Gpt::positions", Kokkos::RangePolicy<Exec>(exec, 0, pos.extent(0)),
      KOKKOS_LAMBDA(std::size_t n) { pos(n) = static_cast<typename Ids::value_type>(n % Tn); });
}
}  // namespace detail

/// \brief GPT language model spread over the tp and pp axes of a Mesh (see the file comment).
/// \code
/// pmt::nn::Gpt<float, Kokkos::OpenMP> model(mesh, {/*vocab=*/256, /*context=*/128, /*layers=*/4, /*width=*/256,
/// /*heads=*/4}); double loss = model.forward_backward(exec, ids, targets, B, T, /*normaliser=*/global_tokens);  // pp
/// = 1 \endcode \throws pmt::ShapeError for non-positive sizes, heads, width or vocab that do not divide by tp, or
/// inputs that do not fit; pmt::ConfigError for fewer layers than stages or a plan for another pp.
template <class T, class Exec = Kokkos::DefaultExecutionSpace, class Backend = comm::default_backend_t<Exec>>
class Gpt {
 public:
  using value_type = T;
  using Ids        = typename Embedding<T, Exec, Backend>::Ids;
  using Batch      = parallel::Microbatch<Ids>;  ///< B sequences of T token ids and their targets
  using Activation = Tensor<T, 2, Exec>;

  /// \param plan the blocks of each (virtual) pipeline stage; empty: balanced_plan(c, pp * chunks).
  /// \param chunks model chunks per stage (virtual stages of interleaved schedules; 1: none).
  Gpt(const Mesh<Backend>& mesh, const GptConfig& c, parallel::StagePlan plan = {}, int chunks = 1)
      : Gpt(mesh, c, GptOptions{std::move(plan), chunks, false}) {}
  /// \brief The same with every option (GptOptions: the stage plan, chunks, recomputation).
  Gpt(const Mesh<Backend>& mesh, const GptConfig& c, GptOptions options)
      : m_cfg(checked(c)),
        m_tp(mesh.comm(Axis::tp)),
        m_stage(mesh.coord(Axis::pp)),
        m_stages(mesh.degree(Axis::pp)),
        m_chunks(checked_chunks(c, m_stages, options.chunks)),
        m_plan(options.plan.empty() ? balanced_plan(c, m_stages * options.chunks) : std::move(options.plan)),
        m_recompute(options.recompute),
        m_recompute_attention(options.recompute_attention && !options.recompute),
        m_seq(options.sequence_parallel && m_tp.size() > 1) {
    const int chunks = options.chunks;
    pmt::detail::require<ConfigError>(
        m_plan.stages() == m_stages * chunks && m_plan.layers() == c.layers, "pmt::nn::Gpt", [&] {
          return pmt::detail::str("the stage plan (", m_plan.describe(), ") is for ", m_plan.stages(), " stages and ",
                                  m_plan.layers(), " layers; the mesh has pp = ", m_stages, " with ", chunks,
                                  " chunks per stage (", m_stages * chunks, " virtual stages) and the model ", c.layers,
                                  " layers");
        });
    if (first_stage()) {
      m_wte = std::make_unique<Embedding<T, Exec, Backend>>(mesh, "wte", c.vocab, c.width, RngKey{c.seed, 0},
                                                            VocabSplit::Yes);
      m_wpe = std::make_unique<Embedding<T, Exec, Backend>>(mesh, "wpe", c.context, c.width, RngKey{c.seed, 1},
                                                            VocabSplit::No, 0.01);
      m_wte->table().name = "wte", m_wpe->table().name = "wpe";
    }
    if (last_stage()) {
      if (!first_stage()) {  // the tied LM head's own copy of wte: same RNG stream, same values
        m_head = std::make_unique<Embedding<T, Exec, Backend>>(mesh, "wte", c.vocab, c.width, RngKey{c.seed, 0},
                                                               VocabSplit::Yes);
        m_head->table().name    = "wte";
        m_head->table().pp_copy = true;
      }
      m_lnf                        = std::make_unique<LayerNorm<T, Exec>>("lnf", c.width);
      m_lnf->parameters()[0]->name = "lnf.weight", m_lnf->parameters()[1]->name = "lnf.bias";
      for (auto* p : m_lnf->parameters()) p->tp_partial = m_seq;
    }
    m_blocks.resize(static_cast<std::size_t>(chunks));
    for (int k = 0; k < chunks; ++k)
      for (std::size_t i = m_plan.begin(k * m_stages + m_stage); i < m_plan.end(k * m_stages + m_stage); ++i) {
        m_blocks[std::size_t(k)].push_back(std::make_unique<GptBlock<T, Exec, Backend>>(mesh, c, i, m_seq));
        m_blocks[std::size_t(k)].back()->name_parameters(i);
        m_blocks[std::size_t(k)].back()->recompute(m_recompute);
        m_blocks[std::size_t(k)].back()->recompute_attention(m_recompute_attention);
      }
  }

  /// \brief The per-block costs (parameters, forward FLOPs per token) and the extra cost of the
  /// first stage (embeddings) and the last (final norm and LM head), for stage balancing.
  static std::vector<parallel::LayerCost> block_costs(const GptConfig& c) { return gpt_block_costs(c); }
  static parallel::LayerCost head_cost(const GptConfig& c) { return gpt_head_cost(c); }
  static parallel::LayerCost tail_cost(const GptConfig& c) { return gpt_tail_cost(c); }
  /// \brief Blocks on `stages` stages balanced by forward FLOPs (the LM head counts on the last).
  static parallel::StagePlan balanced_plan(const GptConfig& c, int stages) { return gpt_balanced_plan(c, stages); }

  /// \brief Forward and backward of one batch through the whole model (pp = 1): ids and targets
  /// (B T) of this rank's data shard. Returns this batch's loss divided by `normaliser` (pass the
  /// global token count so that ranks' and microbatches' losses add up to the global mean);
  /// gradients accumulate. With sequence parallelism the norms' and Row biases' gradients are
  /// then this rank's rows' part: call parallel::sum_partial_grads once after the last batch (the
  /// Trainer does). \throws pmt::ConfigError with pp > 1 (use pmt::train::Trainer).
  double forward_backward(const Exec& exec, const Ids& ids, const Ids& targets, std::size_t B, std::size_t Tn,
                          double normaliser, std::int64_t ignore_index = -100) {
    pmt::detail::require<ConfigError>(m_stages == 1, "pmt::nn::Gpt::forward_backward", [&] {
      return pmt::detail::str("this rank holds pipeline stage ", m_stage, " of ", m_stages,
                              "; run the stages with pmt::train::Trainer (or parallel::PipelineRunner)");
    });
    double loss = 0;
    Activation x;
    for (int k = 0; k < m_chunks; ++k)
      x = forward_chunk(exec, k, ids, targets, x, B, Tn, normaliser, &loss, ignore_index);
    for (int k = m_chunks - 1; k >= 0; --k) x = backward_chunk(exec, k, x);
    return loss;
  }

  /// \brief This stage's forward of one microbatch (one chunk per stage), saving into the
  /// current activation slot. The first stage reads `ids`, the others `x_in` (N, C) from the
  /// previous stage. Returns the activation (N, C) for the next stage; the last stage instead
  /// computes the loss against `targets` (added to *loss, divided by `normaliser`), runs the LM
  /// head's backward at once and keeps its gradient for backward_stage, and returns an empty View.
  /// \throws pmt::ConfigError with more than one chunk per stage (use forward_chunk).
  Activation forward_stage(const Exec& exec, const Ids& ids, const Ids& targets, const Activation& x_in, std::size_t B,
                           std::size_t Tn, double normaliser, double* loss, std::int64_t ignore_index = -100) {
    single_chunk("pmt::nn::Gpt::forward_stage");
    return forward_chunk(exec, 0, ids, targets, x_in, B, Tn, normaliser, loss, ignore_index);
  }
  /// \brief forward_stage of chunk k (virtual stage k pp + stage()): the first virtual stage
  /// reads `ids`, the last computes the loss.
  Activation forward_chunk(const Exec& exec, int k, const Ids& ids, const Ids& targets, const Activation& x_in,
                           std::size_t B, std::size_t Tn, double normaliser, double* loss,
                           std::int64_t ignore_index = -100) {
    const std::size_t N = B * Tn, C = m_cfg.width, Nl = local_rows(N);
    const bool first = first_chunk(k), last = last_chunk(k);
    pmt::detail::require(
        k >= 0 && k < m_chunks && Tn <= m_cfg.context && (!first || ids.extent(0) == N) &&
            (!last || targets.extent(0) == N) && (first || (x_in.extent(0) == Nl && x_in.extent(1) == C)),
        "pmt::nn::Gpt", [&] {
          return pmt::detail::str("stage ", m_stage, "/", m_stages, ", chunk ", k, "/", m_chunks, ": ids is ",
                                  shape_str(ids), ", targets ", shape_str(targets), " and x ", shape_str(x_in),
                                  " for B = ", B, ", T = ", Tn,
                                  "; expected ids (B T) on the first stage, targets (B T) on the last, x (B T",
                                  m_seq ? " / tp, " : ", ", C, ") on the others, and T <= context ", m_cfg.context);
        });
    Activation x = first ? embed(exec, ids, N, Tn) : x_in;
    for (auto& b : m_blocks[std::size_t(k)]) {
      {
        const Reading values(*this, b->parameters());
        x = b->forward(exec, x, B, Tn);
      }
      pmt::progress();  // let pending pipeline sends and receives move (core/progress.hpp)
    }
    if (!last) return x;
    const Instrument head_region("pmt::nn::Gpt::head_and_loss");
    // Tied LM head: logits (N, V/tp) = h wte_shard^T (the rows of every tp rank, with sequence
    // parallelism gathered).
    auto h     = gathered(exec, final_norm(exec, x));
    auto& head = head_table();
    const Reading head_values(*this, {&head.table()});
    auto table  = head.table().value2d();
    auto logits = workspace_view<Activation>("pmt::nn::Gpt::logits", N, table.extent(0));
    ops::matmul(exec, ops::Trans::N, ops::Trans::T, T(1), h, table, T(0), logits);
    auto dlogits = workspace_view<Activation>("pmt::nn::Gpt::dlogits", N, table.extent(0));
    const double l =
        vocab_parallel_cross_entropy(m_tp, exec, logits, targets, head.vocab_offset(),
                                     static_cast<std::int64_t>(m_cfg.vocab), normaliser, dlogits, ignore_index);
    if (loss != nullptr) *loss += l;
    if (!step_context().grad) return Activation();  // evaluation: no backward follows
    // Backward of the head: dh = dlogits wte_shard (partial over the vocabulary: all-reduce, or
    // reduce-scatter to this rank's rows), d wte_shard += dlogits^T h.
    auto dh = workspace_view<Activation>("pmt::nn::Gpt::dh", N, C);
    ops::matmul(exec, ops::Trans::N, ops::Trans::N, T(1), dlogits, table, T(0), dh);
    needed({&head.table()});
    ops::matmul(exec, ops::Trans::T, ops::Trans::N, T(1), dlogits, h, T(1), head.table().grad2d());
    if (m_seq) {
      *m_dh = parallel::reduce_scatter_rows(m_tp, exec, dh);  // conjugate of gathering h
    } else {
      parallel::copy_to_backward(m_tp, exec, dh);  // h entered the vocabulary-split head whole
      *m_dh = dh;
    }
    return Activation();
  }

  /// \brief forward_chunk of the stage-module contract: the microbatch's ids, targets, B and T.
  Activation forward_chunk(const Exec& exec, int k, const Batch& mb, const Activation& x_in, double normaliser,
                           double* loss) {
    return forward_chunk(exec, k, mb.ids, mb.targets, x_in, mb.B, mb.T, normaliser, loss);
  }
  /// \brief The local shape of chunk k's input and output activations: (B T, width) both
  /// ((B T / tp, width) with sequence parallelism).
  /// \throws pmt::ShapeError with sequence parallelism when tp does not divide B T.
  std::array<std::size_t, 2> input_extent(int, const Batch& mb) const { return {local_rows(mb.B * mb.T), m_cfg.width}; }
  std::array<std::size_t, 2> output_extent(int k, const Batch& mb) const noexcept { return input_extent(k, mb); }

  /// \brief Inference: like forward_stage, but the last stage returns this rank's logits
  /// (N, V/tp: vocabulary entries [vocab_offset(), vocab_offset() + V/tp)) and computes no loss
  /// and no gradient. Activations are saved in the current slot (the next forward replaces them).
  /// \throws pmt::ConfigError with more than one chunk per stage (use infer_chunk).
  /// Inference runs without sequence parallelism (the same values, any token count): the
  /// activations are (B T, width) here.
  Activation infer_stage(const Exec& exec, const Ids& ids, const Activation& x_in, std::size_t B, std::size_t Tn) {
    if (m_stages > 1) single_chunk("pmt::nn::Gpt::infer_stage");
    const WholeRows whole(*this);
    Activation x = x_in;  // pp = 1: the whole model, chunk after chunk
    for (int k = 0; k + 1 < m_chunks; ++k) x = forward_chunk(exec, k, ids, Ids(), x, B, Tn, 1.0, nullptr);
    return infer_chunk(exec, m_chunks - 1, ids, x, B, Tn);
  }
  /// \brief infer_stage of chunk k.
  Activation infer_chunk(const Exec& exec, int k, const Ids& ids, const Activation& x_in, std::size_t B,
                         std::size_t Tn) {
    const WholeRows whole(*this);  // inference: every rank all the rows
    if (!last_chunk(k)) return forward_chunk(exec, k, ids, Ids(), x_in, B, Tn, 1.0, nullptr);
    Activation x = first_chunk(k) ? embed(exec, ids, B * Tn, Tn) : x_in;  // pp = 1: the whole model
    for (auto& b : m_blocks[std::size_t(k)]) {
      const Reading values(*this, b->parameters());
      x = b->forward(exec, x, B, Tn);
    }
    auto h = gathered(exec, final_norm(exec, x));
    const Reading head_values(*this, {&head_table().table()});
    auto table  = head_table().table().value2d();
    auto logits = workspace_view<Activation>("pmt::nn::Gpt::logits", h.extent(0), table.extent(0));
    ops::matmul(exec, ops::Trans::N, ops::Trans::T, T(1), h, table, T(0), logits);
    return logits;
  }
  /// \brief The first vocabulary entry of this rank's logits (tp shard).
  std::int64_t vocab_offset() const noexcept { return last_stage() ? (m_head ? m_head : m_wte)->vocab_offset() : 0; }

  /// \brief This stage's backward of the microbatch of the current activation slot: `dy` is the
  /// gradient of this stage's output from the next stage (ignored on the last stage, which uses
  /// the LM head's). Returns the gradient for the previous stage (empty on the first stage).
  /// \throws pmt::ConfigError with more than one chunk per stage (use backward_chunk).
  Activation backward_stage(const Exec& exec, const Activation& dy) {
    single_chunk("pmt::nn::Gpt::backward_stage");
    return backward_chunk(exec, 0, dy);
  }
  /// \brief backward_stage of chunk k.
  Activation backward_chunk(const Exec& exec, int k, const Activation& dy) {
    Activation dx;
    if (last_chunk(k)) {
      needed(m_lnf->parameters());
      const Reading values(*this, m_lnf->parameters());
      dx = m_lnf->backward(exec, m_dh.take());
      if (m_on_block_grads) m_on_block_grads(m_lnf->parameters());
    } else {
      pmt::detail::require(k >= 0 && k < m_chunks && dy.extent(1) == m_cfg.width, "pmt::nn::Gpt::backward_chunk", [&] {
        return pmt::detail::str("stage ", m_stage, ", chunk ", k, "/", m_chunks, ": dy is ", shape_str(dy),
                                "; expected (B T, ", m_cfg.width, ")");
      });
      dx = dy;
    }
    auto& blocks = m_blocks[std::size_t(k)];
    for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) {
      needed((*it)->parameters());
      {
        const Reading values(*this, (*it)->parameters());
        dx = (*it)->backward(exec, dx);
      }
      if (m_on_block_grads) m_on_block_grads((*it)->parameters());
      pmt::progress();
    }
    if (!first_chunk(k)) return dx;
    if (m_seq) dx = parallel::gather_rows(m_tp, exec, dx);  // conjugate of splitting the embeddings' rows
    const std::vector<Parameter<T, Exec>*> embeddings{&m_wpe->table(), &m_wte->table()};
    needed(embeddings);
    m_wpe->backward(exec, dx);
    m_wte->backward(exec, dx);
    if (m_on_block_grads) m_on_block_grads(embeddings);  // wte: the tied head's part is in too (pp = 1)
    return Activation();
  }

  /// \brief With pp > 1: the tied embedding / LM-head table, whose copies on the first and the
  /// last stage parallel::finalize_grads sums; other stages and pp = 1 have none.
  std::vector<parallel::TiedParameter<T, Exec>> tied_parameters() {
    if (m_stages == 1 || (!first_stage() && !last_stage())) return {};
    if (first_stage()) return {{&m_wte->table(), m_stages - 1}};
    return {{&m_head->table(), 0}};
  }

  /// \brief Called during backward with the parameters of each block, of the final norm and of
  /// the embeddings once their gradients are final (data-parallel gradient sync starts its
  /// all-reduces there, overlapping backward). A last stage's copy of the LM head, written in
  /// forward_chunk, is not reported: its gradient is final at the end of the step.
  void on_grads_ready(std::function<void(const std::vector<Parameter<T, Exec>*>&)> hook) {
    m_on_block_grads = std::move(hook);
  }
  /// \brief Called with parameters whose gradients are written next: each block's, the final
  /// norm's and the embeddings' before their backward, the LM head's before its backward inside
  /// forward_chunk (optim::Zero2AdamW gives them storage there).
  void on_grads_needed(std::function<void(const std::vector<Parameter<T, Exec>*>&)> hook) {
    m_on_needed = std::move(hook);
  }
  /// \brief Called with the parameters whose values are read next (the embeddings', each
  /// block's before its forward and its backward, the final norm's, the LM head's), and once
  /// they are no longer read (optim::Zero3AdamW gathers them in between).
  void on_values_needed(std::function<void(const std::vector<Parameter<T, Exec>*>&)> hook) {
    m_on_values_needed = std::move(hook);
  }
  void on_values_done(std::function<void(const std::vector<Parameter<T, Exec>*>&)> hook) {
    m_on_values_done = std::move(hook);
  }

  /// \brief This stage's parameters, in a fixed order (embeddings, blocks, final norm, then the
  /// LM head's copy of wte on a last stage that is not the first).
  std::vector<Parameter<T, Exec>*> parameters() {
    std::vector<Parameter<T, Exec>*> all;
    if (first_stage()) all = {&m_wte->table(), &m_wpe->table()};
    for (auto& chunk : m_blocks)
      for (auto& b : chunk)
        for (auto* p : b->parameters()) all.push_back(p);
    if (last_stage()) {
      for (auto* p : m_lnf->parameters()) all.push_back(p);
      if (m_head) all.push_back(&m_head->table());
    }
    return all;
  }
  const GptConfig& config() const noexcept { return m_cfg; }
  const parallel::StagePlan& plan() const noexcept { return m_plan; }
  int stage() const noexcept { return m_stage; }
  int stages() const noexcept { return m_stages; }
  /// \brief Model chunks per stage (virtual stages chunks() * stages()).
  int chunks() const noexcept { return m_chunks; }
  /// \brief Whether this stage holds the embeddings (in its chunk 0).
  bool first_stage() const noexcept { return m_stage == 0; }
  /// \brief Whether this stage holds the final norm and LM head (in its last chunk).
  bool last_stage() const noexcept { return m_stage + 1 == m_stages; }
  bool first_chunk(int k) const noexcept { return first_stage() && k == 0; }
  bool last_chunk(int k) const noexcept { return last_stage() && k + 1 == m_chunks; }
  std::size_t width() const noexcept { return m_cfg.width; }
  /// \brief Whether the blocks recompute their activations in backward (GptOptions::recompute).
  bool recomputes() const noexcept { return m_recompute; }
  /// \brief Whether the blocks' attention is recomputed in backward (GptOptions::recompute_attention).
  bool recomputes_attention() const noexcept { return m_recompute_attention; }
  /// \brief Whether the model runs sequence-parallel (GptOptions::sequence_parallel with tp > 1).
  bool sequence_parallel() const noexcept { return m_seq; }

 private:
  static const GptConfig& checked(const GptConfig& c) {
    pmt::detail::require(
        c.vocab > 0 && c.context > 0 && c.layers > 0 && c.width > 0 && c.heads > 0, "pmt::nn::Gpt", [&] {
          return pmt::detail::str("vocab ", c.vocab, ", context ", c.context, ", layers ", c.layers, ", width ",
                                  c.width, ", heads ", c.heads, ": every size must be positive");
        });
    return c;
  }
  static int checked_chunks(const GptConfig& c, int stages, int chunks) {
    pmt::detail::require<ConfigError>(
        chunks >= 1 && (chunks == 1 || c.layers >= static_cast<std::size_t>(stages) * std::size_t(chunks)),
        "pmt::nn::Gpt", [&] {
          return pmt::detail::str(c.layers, " layers cannot fill pp ", stages, " x ", chunks,
                                  " chunks: every chunk needs a layer (chunks must be >= 1 and at most ",
                                  c.layers / std::size_t(std::max(stages, 1)), " here)");
        });
    return chunks;
  }
  Embedding<T, Exec, Backend>& head_table() { return m_head ? *m_head : *m_wte; }
  void single_chunk(const char* op) const {
    pmt::detail::require<ConfigError>(m_chunks == 1, op, [&] {
      return pmt::detail::str("this stage holds ", m_chunks,
                              " model chunks; run one with the *_chunk function of its index");
    });
  }
  /// Token + position embeddings of ids (N = B T) on the first stage.
  Activation embed(const Exec& exec, const Ids& ids, std::size_t N, std::size_t Tn) {
    const Reading values(*this, {&m_wte->table(), &m_wpe->table()});
    positions(exec, N, Tn);
    auto x = workspace_view<Activation>("pmt::nn::Gpt::x", N, m_cfg.width);  // overwritten
    m_wte->forward(exec, ids, x);
    m_wpe->forward(exec, m_pos, x, /*accumulate=*/true);
    return m_seq ? parallel::split_rows(m_tp, exec, x) : x;  // sequence parallelism: this rank's rows
  }
  /// The final norm's forward, its values named.
  Activation final_norm(const Exec& exec, const Activation& x) {
    const Reading values(*this, m_lnf->parameters());
    return m_lnf->forward(exec, x);
  }
  /// Names the parameters whose values a layer reads while it lives (on_values_needed, then
  /// on_values_done: ZeRO-3 gathers them in between).
  class Reading {
   public:
    Reading(const Gpt& m, std::vector<Parameter<T, Exec>*> ps) : m_model(m), m_params(std::move(ps)) {
      if (m_model.m_on_values_needed) m_model.m_on_values_needed(m_params);
    }
    ~Reading() {
      if (m_model.m_on_values_done) m_model.m_on_values_done(m_params);
    }
    Reading(const Reading&)            = delete;
    Reading& operator=(const Reading&) = delete;

   private:
    const Gpt& m_model;
    std::vector<Parameter<T, Exec>*> m_params;
  };
  /// Sequence parallelism off while it lives (inference), back on after.
  class WholeRows {
   public:
    explicit WholeRows(Gpt& m) : m_model(m), m_was(m.m_seq) {
      if (m_was) m_model.split_rows(false);
    }
    ~WholeRows() {
      if (m_was) m_model.split_rows(true);
    }
    WholeRows(const WholeRows&)            = delete;
    WholeRows& operator=(const WholeRows&) = delete;

   private:
    Gpt& m_model;
    bool m_was;
  };
  void split_rows(bool on) {
    m_seq = on;
    for (auto& chunk : m_blocks)
      for (auto& b : chunk) b->sequence_parallel(on);
  }
  /// The rows this rank's activations hold: N, or N / tp with sequence parallelism.
  std::size_t local_rows(std::size_t N) const { return m_seq ? parallel::local_rows(m_tp, N, "pmt::nn::Gpt") : N; }
  /// h itself, or every tp rank's rows of it gathered (sequence parallelism).
  Activation gathered(const Exec& exec, const Activation& h) {
    return m_seq ? parallel::gather_rows(m_tp, exec, h) : h;
  }
  void positions(const Exec& exec, std::size_t N, std::size_t Tn) {
    if (m_pos.extent(0) == N && m_pos_T == Tn) return;
    m_pos   = Ids("pmt::nn::Gpt::positions", N);
    m_pos_T = Tn;
    detail::fill_positions(exec, m_pos, Tn);
  }

  GptConfig m_cfg;
  comm::Communicator<Backend> m_tp;
  int m_stage, m_stages, m_chunks;
  parallel::StagePlan m_plan;
  bool m_recompute = false, m_recompute_attention = false;
  bool m_seq = false;  // sequence parallelism (tp > 1)
  std::unique_ptr<Embedding<T, Exec, Backend>> m_wte, m_wpe, m_head;
  std::vector<std::vector<std::unique_ptr<GptBlock<T, Exec, Backend>>>> m_blocks;  // per chunk
  std::unique_ptr<LayerNorm<T, Exec>> m_lnf;
  Ids m_pos;
  std::size_t m_pos_T = 0;
  Saved<Activation> m_dh;  // the LM head's gradient of the final norm's output, per activation slot
  std::function<void(const std::vector<Parameter<T, Exec>*>&)> m_on_block_grads, m_on_needed, m_on_values_needed,
      m_on_values_done;
  void needed(const std::vector<Parameter<T, Exec>*>& ps) const {
    if (m_on_needed) m_on_needed(ps);
  }
};

}  // namespace pmt::nn
