// SPDX-License-Identifier: Apache-2.0
#pragma once
// StagedModel<Net, Loss>: a user's Chain and a loss as a stage module (parallel/stage_module.hpp),
// so that train::Trainer trains it on any dp x tp x pp layout with any pipeline schedule (GPipe,
// 1F1B, interleaved), exactly as it trains nn::Gpt.
//   Net   a Chain of layers (Linear<Col|Row|Replicate>, Gelu, Relu, LayerNorm, nested Chains ...)
//         whose placements Chain checks at compile time; its first layer says its input width.
//   Loss  a loss layer (nn/loss.hpp: MseLoss, CrossEntropyLoss) or any callable
//         double(const Exec&, const Activation& y, const Target&, double normaliser, const Activation& dy)
//         returning the microbatch's loss divided by the normaliser and writing dL/dy; for a
//         callable without a target_type, name the Target type as the third template argument.
// Stages: the Chain's layers are cut into pp * chunks consecutive ranges (virtual stages) by a
// StagePlan over the layer indices: given, or balanced by each layer's forward FLOPs per row
// (2 x its global parameter count; a layer without parameters counts 1, so it still weighs).
// Rank (pp s) runs virtual stages k pp + s, k < chunks. Every rank constructs the whole Chain (so
// parameter values and names are those of the one-rank model), then frees the values and
// gradients of the layers other stages hold: construction briefly holds this tp shard of the
// whole model, training only this stage's part. The tensor at a cut is sent as it is: a cut
// after a Col layer sends this tp rank's shard (N, out/tp) to the same tp rank of the next stage.
// Batch: parallel::Samples<Activation, Target>{input (N, in), target, N}. The first stage reads
// the input, the last the target; others may leave them empty, but `rows` is needed everywhere
// (the Trainer numbers the global batch's rows by it, and those numbers key Dropout's masks).
// Gradient hooks: before each layer's backward (its gradients are written next: ZeRO-2 gives them
// storage) and after it (final: data-parallel all-reduces overlap the rest).
// StagedOptions::recompute: activation recomputation per chunk (a chunk's forward keeps only its
// input; its backward runs the forward again first), the same gradients bit for bit.
// Communication: that of the Chain's layers (tp); the pipeline runner moves the activations.

#include "pmt/comm/backend.hpp"
#include "pmt/comm/mesh.hpp"
#include "pmt/core/activation_slot.hpp"
#include "pmt/core/error.hpp"
#include "pmt/core/failure.hpp"
#include "pmt/core/instrument.hpp"
#include "pmt/core/parameter.hpp"
#include "pmt/core/random.hpp"
#include "pmt/core/step_context.hpp"
#include "pmt/core/tensor.hpp"
#include "pmt/core/workspace.hpp"
#include "pmt/nn/chain.hpp"
#include "pmt/nn/module.hpp"
#include "pmt/parallel/regions.hpp"
#include "pmt/parallel/stage_module.hpp"
#include "pmt/parallel/stages.hpp"
#include "pmt/policy/hybrid.hpp"

#include <Kokkos_Core.hpp>

#include <array>
#include <cstddef>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace pmt::nn {

namespace detail {
template <class Loss, class = void>
struct loss_target {
  using type = void;
};
template <class Loss>
struct loss_target<Loss, std::void_t<typename Loss::target_type>> {
  using type = typename Loss::target_type;
};
}  // namespace detail

/// \brief How a StagedModel cuts its Chain.
struct StagedOptions {
  parallel::StagePlan plan;  ///< layers per virtual stage (pp * chunks of them); empty: balanced
  int chunks = 1;            ///< model chunks per stage (interleaved schedules); 1: none
  std::string name;          ///< when set, the whole Chain's parameters are named name.0, name.1, ...
  /// Activation recomputation: each chunk's forward keeps only its input (pmt::KeepNothing
  /// inside) and its backward runs the forward again, keeping the activations, before going back:
  /// the same gradients, bit for bit, for one more forward per microbatch and a stage's live
  /// microbatches holding one tensor each instead of every layer's.
  bool recompute = false;
};

/// \brief `base` with what the policy fixes about activations for this rank: under
/// Recompute<Full, Stages>, recompute on exactly where this rank's pipeline stage recomputes (see
/// pmt::activation_policy). A StagedModel recomputes whole chunks and has no sequence
/// parallelism: Recompute<Selective> and TensorSplit<Sequence> do not compile here.
template <class Policy, class Backend>
StagedOptions staged_options(const Mesh<Backend>& mesh, StagedOptions base = {}) {
  using A = activation_policy<Policy>;
  static_assert(!A::selective,
                "pmt::nn::staged_options: a StagedModel recomputes whole chunks; use pmt::Recompute<pmt::Full> "
                "(Recompute<Selective> recomputes a Gpt's attention core)");
  static_assert(!A::sequence_parallel,
                "pmt::nn::staged_options: a StagedModel has no sequence parallelism; use TensorSplit<> in the policy");
  if constexpr (A::fixes_recompute) base.recompute = A::recomputes_on(mesh.coord(Axis::pp));
  return base;
}

/// \brief A Chain and a loss as a pipeline-stage module (see the file comment).
/// \throws pmt::ConfigError for a plan of another size or fewer layers than virtual stages.
template <class Net, class Loss, class Target = typename detail::loss_target<Loss>::type,
          class Backend = comm::default_backend_t<typename Net::execution_space>>
class StagedModel {
  static_assert(!std::is_void_v<Target>,
                "pmt::nn::StagedModel: the loss has no target_type; name the target type as the third template "
                "argument, StagedModel<Net, Loss, Target>");

 public:
  using value_type = typename Net::value_type;
  using T          = value_type;
  using Exec       = typename Net::execution_space;
  using Activation = Tensor<T, 2, Exec>;
  using Batch      = parallel::Samples<Activation, Target>;
  using Hook       = std::function<void(const std::vector<Parameter<T, Exec>*>&)>;

  StagedModel(const Mesh<Backend>& mesh, Net net, Loss loss = Loss(), StagedOptions options = {})
      : m_net(std::move(net)),
        m_loss(std::move(loss)),
        m_pp(mesh.comm(Axis::pp)),
        m_stage(mesh.coord(Axis::pp)),
        m_stages(mesh.degree(Axis::pp)),
        m_chunks(options.chunks),
        m_group(mesh.degree(Axis::tp) * mesh.degree(Axis::pp)),
        m_recompute(options.recompute) {
    constexpr const char* op = "pmt::nn::StagedModel";
    const std::size_t L      = Net::size();
    const int virtual_stages = m_stages * m_chunks;
    pmt::detail::require<ConfigError>(m_chunks >= 1 && L >= static_cast<std::size_t>(virtual_stages), op, [&] {
      return pmt::detail::str("a chain of ", L, " layers cannot fill pp ", m_stages, " x ", m_chunks,
                              " chunks: every virtual stage needs a layer (chunks >= 1, pp x chunks <= ", L, ")");
    });
    if (!options.name.empty()) name_parameters(m_net.parameters(), options.name);
    const auto layers = m_net.layer_parameters();
    if (options.plan.empty()) {
      std::vector<parallel::LayerCost> costs(L);
      for (std::size_t l = 0; l < L; ++l) {
        double global = 0;
        for (auto* p : layers[l]) {
          double n = 1;  // the global element count, the same on every tp degree
          for (std::size_t d = 0; d < p->local_shape.size(); ++d) n *= static_cast<double>(p->slice.extent[d]);
          global += n;
        }
        costs[l] = {global, global > 0 ? 2 * global : 1.0};
      }
      m_plan = parallel::balanced_stages(costs, virtual_stages);
    } else {
      m_plan = std::move(options.plan);
    }
    pmt::detail::require<ConfigError>(m_plan.stages() == virtual_stages && m_plan.layers() == L, op, [&] {
      return pmt::detail::str("the stage plan (", m_plan.describe(), ") is for ", m_plan.stages(), " stages and ",
                              m_plan.layers(), " layers; the mesh has pp = ", m_stages, " with ", m_chunks,
                              " chunks per stage (", virtual_stages, " virtual stages) and the chain ", L, " layers");
    });
    m_widths = m_net.widths(m_net.input_width());
    // free what other stages hold: only this stage's layers run here
    std::vector<bool> mine(L, false);
    for (int k = 0; k < m_chunks; ++k)
      for (std::size_t l = begin(k); l < end(k); ++l) mine[l] = true;
    for (std::size_t l = 0; l < L; ++l)
      if (!mine[l])
        for (auto* p : layers[l]) p->value = {}, p->grad = {};
  }
  StagedModel(const StagedModel&)            = delete;  // layers hold per-slot state
  StagedModel& operator=(const StagedModel&) = delete;

  /// \brief Chunk k's forward of one microbatch (the stage-module contract).
  Activation forward_chunk(const Exec& exec, int k, const Batch& mb, const Activation& x_in, double normaliser,
                           double* loss) {
    const Instrument instrument("pmt::nn::StagedModel::forward");
    const bool first = first_chunk(k), last = last_chunk(k);
    const Activation& x = first ? mb.input : x_in;
    const auto want     = input_extent(k, mb);
    pmt::detail::require(k >= 0 && k < m_chunks && x.extent(0) == want[0] && x.extent(1) == want[1],
                         "pmt::nn::StagedModel::forward_chunk", [&] {
                           return pmt::detail::str("stage ", m_stage, "/", m_stages, ", chunk ", k, "/", m_chunks,
                                                   " (layers [", begin(k), ", ", end(k),
                                                   ")): ", first ? "the batch's input" : "x_in", " is ", shape_str(x),
                                                   " for ", mb.rows, " rows; expected (", want[0], ", ", want[1], ")");
                         });
    const bool recompute = m_recompute && step_context().grad;
    Activation y;
    if (recompute) {  // keep the input and the random context; the backward runs this again
      *m_replay = {x, step_context().random};
      const KeepNothing nothing_kept;  // Dropout still drops
      y = m_net.forward(exec, x, begin(k), end(k), m_values);
    } else {
      y = m_net.forward(exec, x, begin(k), end(k), m_values);
    }
    if (!last) return y;
    auto dy        = workspace_view<Activation>("pmt::nn::StagedModel::dy", y.extent(0), y.extent(1));
    const double l = m_loss(exec, y, mb.target, normaliser, dy);
    if (loss != nullptr) *loss += l;
    if (step_context().grad) *m_dy = dy;
    return Activation();
  }
  /// \brief Chunk k's backward of the current slot's microbatch (the stage-module contract).
  Activation backward_chunk(const Exec& exec, int k, const Activation& dy) {
    const Instrument instrument("pmt::nn::StagedModel::backward");
    Activation d = last_chunk(k) ? m_dy.take() : dy;
    if (m_recompute) {  // the forward again, keeping the activations this time (same Dropout masks)
      const Replay r = m_replay.take();
      pmt::detail::require(r.x.data() != nullptr, "pmt::nn::StagedModel::backward_chunk", [&] {
        return pmt::detail::str("stage ", m_stage, ", chunk ", k, ": no forward_chunk ran in this activation slot");
      });
      const RandomScope keys(r.random);  // the first forward's step and rows: the same Dropout masks
      m_net.forward(exec, r.x, begin(k), end(k), m_values);
    }
    const std::size_t width = m_widths.at(end(k));  // of the chunk's output
    pmt::detail::require(k >= 0 && k < m_chunks && d.data() != nullptr && d.extent(1) == width,
                         "pmt::nn::StagedModel::backward_chunk", [&] {
                           return pmt::detail::str(
                               "stage ", m_stage, ", chunk ", k, "/", m_chunks, ": dy is ", shape_str(d),
                               "; expected (N, ", width, ")",
                               last_chunk(k) ? " (no forward_chunk ran in this activation slot)" : "");
                         });
    Activation dx = m_net.backward(exec, d, begin(k), end(k), m_hook, m_needed, m_values);
    return first_chunk(k) ? Activation() : dx;
  }
  /// \brief Inference through the whole chain in evaluation mode (pmt::NoGrad: no activation is
  /// kept, Dropout is the identity): the output (N, out), no loss, on every rank. Collective over
  /// the mesh's pp and tp axes: every rank calls it with the same x (N, in) (only stage 0 reads
  /// its values); the virtual stages run in order, each handing its output to the next stage's
  /// rank, and the last stage's output is shared with the other stages. On one rank: the chain.
  /// An error on one rank is recorded (pmt::note_failure) before it leaves, as in Trainer::step:
  /// the other ranks wait for this one, and pmt::ScopeGuard ends the job.
  Activation predict(const Exec& exec, const Activation& x) {
    const NoGrad eval;
    try {
      return predict_stages(exec, x);
    } catch (...) {
      if (m_group > 1)
        note_failure(pmt::detail::str("pmt::nn::StagedModel::predict on pipeline stage ", m_stage, " of ", m_stages,
                                      ": ", pmt::detail::message_of(std::current_exception())));
      throw;
    }
  }

  std::array<std::size_t, 2> input_extent(int k, const Batch& mb) const { return {mb.rows, m_widths.at(begin(k))}; }
  std::array<std::size_t, 2> output_extent(int k, const Batch& mb) const { return {mb.rows, m_widths.at(end(k))}; }

  /// \brief This stage's parameters (its chunks' layers, in layer order).
  std::vector<Parameter<T, Exec>*> parameters() {
    std::vector<Parameter<T, Exec>*> all;
    for (int k = 0; k < m_chunks; ++k) {
      auto more = m_net.parameters(begin(k), end(k));
      all.insert(all.end(), more.begin(), more.end());
    }
    return all;
  }
  void on_grads_ready(Hook hook) { m_hook = std::move(hook); }
  /// \brief Called before each layer's backward with its parameters (their gradients are written next).
  void on_grads_needed(Hook hook) { m_needed = std::move(hook); }
  /// \brief Called with a layer's parameters before it reads their values (its forward, its
  /// backward, a recomputed forward) and after (optim::Zero3AdamW gathers them in between).
  void on_values_needed(Hook hook) { m_values.needed = std::move(hook); }
  void on_values_done(Hook hook) { m_values.done = std::move(hook); }

  int stage() const noexcept { return m_stage; }
  /// \brief Whether the chunks recompute their activations in backward (StagedOptions::recompute).
  bool recomputes() const noexcept { return m_recompute; }
  int stages() const noexcept { return m_stages; }
  int chunks() const noexcept { return m_chunks; }
  const parallel::StagePlan& plan() const noexcept { return m_plan; }
  /// \brief The first and one-past-last layer of chunk k on this stage.
  std::size_t begin(int k) const { return m_plan.begin(k * m_stages + m_stage); }
  std::size_t end(int k) const { return m_plan.end(k * m_stages + m_stage); }
  bool first_chunk(int k) const noexcept { return m_stage == 0 && k == 0; }
  bool last_chunk(int k) const noexcept { return m_stage + 1 == m_stages && k + 1 == m_chunks; }
  /// \brief The Chain (all its layers; those of other stages hold no values).
  Net& net() noexcept { return m_net; }
  Loss& loss() noexcept { return m_loss; }

 private:
  Activation predict_stages(const Exec& exec, const Activation& x) {
    constexpr const char* op = "pmt::nn::StagedModel::predict";
    const std::size_t rows   = x.extent(0);
    pmt::detail::require(x.extent(1) == m_widths.front(), op, [&] {
      return pmt::detail::str("stage ", m_stage, "/", m_stages, ": x is ", shape_str(x), "; expected (N, ",
                              m_widths.front(), ") on every rank");
    });
    const int V  = m_stages * m_chunks;
    Activation h = x;
    for (int v = 0; v < V; ++v) {
      const int owner = v % m_stages, k = v / m_stages;
      if (owner != m_stage) continue;
      const int prev = (v + m_stages - 1) % m_stages, next = (v + 1) % m_stages;
      if (v > 0 && prev != m_stage) h = parallel::take_over<T>(m_pp, exec, rows, m_widths.at(begin(k)), prev);
      h = m_net.forward(exec, h, begin(k), end(k), m_values);
      if (v + 1 < V && next != m_stage) parallel::hand_on(m_pp, exec, h, next);
    }
    if (m_stages == 1) return h;
    if (m_stage != m_stages - 1) h = Activation("pmt::nn::StagedModel::predict", rows, m_widths.back());
    return parallel::share_from(m_pp, exec, h, m_stages - 1);
  }

  Net m_net;
  Loss m_loss;
  comm::Communicator<Backend> m_pp;  // the pipeline axis (predict's hand-offs)
  int m_stage, m_stages, m_chunks;
  int m_group;  // the ranks one predict spans (tp x pp)
  parallel::StagePlan m_plan;
  std::vector<std::size_t> m_widths;  // the local width entering layer l (m_widths[L]: the output)
  Saved<Activation> m_dy;             // the loss gradient of the last chunk, per activation slot
  bool m_recompute = false;
  struct Replay {
    Activation x;  // the chunk's input
    RandomContext random;
  };
  Saved<Replay> m_replay;  // with recomputation: what the backward's second forward needs, per slot
  Hook m_hook, m_needed;
  typename Net::ValueHooks m_values;
};

}  // namespace pmt::nn
