// SPDX-License-Identifier: Apache-2.0
#pragma once
// The stage-module contract: what pmt::train::Trainer and parallel::PipelineRunner need of a
// model, whatever the model is (nn::Gpt, nn::StagedModel over a user's Chain, or a user's own
// class). A model M spread over a Mesh holds one pipeline stage of `stages()` (the pp coordinate
// of its rank), cut into `chunks()` model chunks (virtual stages of interleaved schedules; 1 for
// plain pipelines and for pp = 1). Virtual stage k * stages() + stage() is this rank's chunk k.
//
// Required members (check_stage_module<M, Exec>() names the first one missing):
//   value_type                  float or double
//   Batch                       one microbatch of this dp rank, as the user builds it: every stage
//                               gets the same list; the first chunk reads its input, the last its
//                               targets (Microbatch<Ids> for token models, Samples<In, Tgt> else)
//   Activation                  Tensor<value_type, 2, Exec>: what flows between stages
//   int stage(), stages(), chunks() const
//   std::vector<pmt::Parameter<value_type, Exec>*> parameters()
//                               this stage's parameters, in a fixed order
//   Activation forward_chunk(const Exec&, int k, const Batch&, const Activation& x_in,
//                            double normaliser, double* loss)
//                               chunk k's forward in the current activation slot: the first chunk
//                               of the model reads the batch (x_in is empty), the others x_in; the
//                               model's last chunk computes the loss against the batch's targets,
//                               divided by `normaliser`, adds it to *loss, keeps the loss gradient
//                               for its backward and returns an empty Activation
//   Activation backward_chunk(const Exec&, int k, const Activation& dy)
//                               chunk k's backward of the slot's microbatch: dy is the gradient of
//                               the chunk's output (ignored by the last chunk); returns the
//                               gradient of x_in (empty for the first chunk); gradients accumulate
//   std::array<std::size_t, 2> input_extent(int k, const Batch&) const
//   std::array<std::size_t, 2> output_extent(int k, const Batch&) const
//                               the local shape of chunk k's x_in and of its output, so that a
//                               stage can post its receives before the sender has computed; they
//                               may raise for a batch the model cannot take (the runner asks them
//                               for every microbatch on every stage before any message)
// A microbatch's rows (rows_of: Batch::rows, else Batch::B, else input_extent(0, batch)[0]) number
// its samples in the step's global batch; the Trainer keys random draws by them.
// Optional members (used when present):
//   void on_grads_ready(std::function<void(const std::vector<Parameter*>&)>)
//                               the model calls the hook during backward with parameters whose
//                               gradients are final (data-parallel all-reduces start there)
//   void on_grads_needed(std::function<void(const std::vector<Parameter*>&)>)
//                               the model calls the hook during backward (and, for gradients a
//                               forward writes, such as an LM head's, during forward) with
//                               parameters whose gradients it is about to write; together with
//                               on_grads_ready it lets optim::Zero2AdamW hold gradient storage
//                               only while it is written. Every parameter must be named before
//                               its gradient is written (a model with this hook promises it)
//   void on_values_needed(std::function<void(const std::vector<Parameter*>&)>)
//   void on_values_done(std::function<void(const std::vector<Parameter*>&)>)
//                               the model calls the first hook with parameters whose values it
//                               reads next (a block's before its forward and again before its
//                               backward, the embeddings', the final norm's, the LM head's), the
//                               second once it no longer reads them; optim::Zero3AdamW (ZeRO-3)
//                               keeps the values sharded and gathers them only in between. Every
//                               read of a value must lie between the two (a model with these hooks
//                               promises it)
//   std::vector<TiedParameter<value_type, Exec>> tied_parameters()
//                               parameters with a copy on another stage (a tied LM head):
//                               finalize_grads() sums each with its peer's copy after backward
//
// finalize_grads(exec, pp, model): the step between the last backward and the optimizer that
// belongs to the parallel layer, not to the model (as Megatron-Core's finalize_model_grads): it
// sums every tied parameter's gradient with its peer stage's copy over the pp communicator, so
// both copies take the same update. The model itself communicates only inside its tp layers.
// sum_partial_grads(exec, tp, parameters): the other such step, for sequence parallelism: the
// gradients of parameters marked Parameter::tp_partial (replicated over tp, each rank having
// seen only its rows) summed over the tp communicator in one all-reduce.

#include "pmt/comm/collectives.hpp"
#include "pmt/comm/communicator.hpp"
#include "pmt/core/error.hpp"
#include "pmt/core/parameter.hpp"
#include "pmt/core/tensor.hpp"
#include "pmt/core/workspace.hpp"
#include "pmt/ops/elementwise.hpp"

#include <Kokkos_Core.hpp>

#include <array>
#include <cstddef>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace pmt::parallel {

/// \brief One microbatch of a token model: B sequences of T tokens and their targets.
template <class Ids>
struct Microbatch {
  Ids ids, targets;
  std::size_t B = 0, T = 0;
};

/// \brief One microbatch of any other model: `rows` samples (on every stage), their input (read
/// by the first stage; may be left empty on others) and their targets (read by the loss on the
/// last stage). The Trainer gives each row its index in the step's global batch (dp rank after dp
/// rank, microbatch after microbatch), which keys layout-independent random draws (Dropout).
template <class Input, class Target>
struct Samples {
  Input input;
  Target target;
  std::size_t rows = 0;
};

/// \brief A parameter whose copy on stage `peer` must receive the same gradient.
template <class T, class Exec>
struct TiedParameter {
  Parameter<T, Exec>* param = nullptr;
  int peer                  = 0;
};

namespace detail {
template <class...>
using void_t = void;
template <class M, class = void>
struct has_types : std::false_type {};
template <class M>
struct has_types<M, void_t<typename M::value_type, typename M::Batch, typename M::Activation>> : std::true_type {};
template <class M, class = void>
struct has_topology : std::false_type {};
template <class M>
struct has_topology<
    M, void_t<decltype(int(std::declval<const M&>().stage())), decltype(int(std::declval<const M&>().stages())),
              decltype(int(std::declval<const M&>().chunks()))>> : std::true_type {};
template <class M, class Exec, class = void>
struct has_parameters : std::false_type {};
template <class M, class Exec>
struct has_parameters<M, Exec, void_t<decltype(std::declval<M&>().parameters())>>
    : std::is_convertible<decltype(std::declval<M&>().parameters()),
                          std::vector<Parameter<typename M::value_type, Exec>*>> {};
template <class M, class Exec, class = void>
struct has_forward : std::false_type {};
template <class M, class Exec>
struct has_forward<M, Exec,
                   void_t<decltype(std::declval<M&>().forward_chunk(
                       std::declval<const Exec&>(), 0, std::declval<const typename M::Batch&>(),
                       std::declval<const typename M::Activation&>(), 1.0, static_cast<double*>(nullptr)))>>
    : std::true_type {};
template <class M, class Exec, class = void>
struct has_backward : std::false_type {};
template <class M, class Exec>
struct has_backward<M, Exec,
                    void_t<decltype(std::declval<M&>().backward_chunk(std::declval<const Exec&>(), 0,
                                                                      std::declval<const typename M::Activation&>()))>>
    : std::true_type {};
template <class M, class = void>
struct has_extents : std::false_type {};
template <class M>
struct has_extents<M, void_t<decltype(std::array<std::size_t, 2>(
                                 std::declval<const M&>().input_extent(0, std::declval<const typename M::Batch&>()))),
                             decltype(std::array<std::size_t, 2>(std::declval<const M&>().output_extent(
                                 0, std::declval<const typename M::Batch&>())))>> : std::true_type {};
template <class M, class = void>
struct has_tied : std::false_type {};
template <class M>
struct has_tied<M, void_t<decltype(std::declval<M&>().tied_parameters())>> : std::true_type {};
template <class M, class Exec, class = void>
struct has_grads_hook : std::false_type {};
template <class M, class Exec>
struct has_grads_hook<M, Exec,
                      void_t<decltype(std::declval<M&>().on_grads_ready(
                          std::function<void(const std::vector<Parameter<typename M::value_type, Exec>*>&)>()))>>
    : std::true_type {};
template <class M, class Exec, class = void>
struct has_needed_hook : std::false_type {};
template <class M, class Exec>
struct has_needed_hook<M, Exec,
                       void_t<decltype(std::declval<M&>().on_grads_needed(
                           std::function<void(const std::vector<Parameter<typename M::value_type, Exec>*>&)>()))>>
    : std::true_type {};
template <class M, class Exec, class = void>
struct has_values_hooks : std::false_type {};
template <class M, class Exec>
struct has_values_hooks<
    M, Exec,
    void_t<decltype(std::declval<M&>().on_values_needed(
               std::function<void(const std::vector<Parameter<typename M::value_type, Exec>*>&)>())),
           decltype(std::declval<M&>().on_values_done(
               std::function<void(const std::vector<Parameter<typename M::value_type, Exec>*>&)>()))>>
    : std::true_type {};
}  // namespace detail

namespace detail {
template <class B, class = void>
struct has_rows : std::false_type {};
template <class B>
struct has_rows<B, void_t<decltype(std::size_t(std::declval<const B&>().rows))>> : std::true_type {};
template <class B, class = void>
struct has_sequences : std::false_type {};
template <class B>
struct has_sequences<B, void_t<decltype(std::size_t(std::declval<const B&>().B))>> : std::true_type {};
}  // namespace detail

/// \brief The samples of one microbatch, the unit by which the Trainer numbers the step's global
/// batch: Batch::rows (Samples), else Batch::B (a Microbatch's sequences), else the rows of the
/// model's first input, input_extent(0, mb)[0].
template <class Model>
std::size_t rows_of(const Model& model, const typename Model::Batch& mb) {
  using B = typename Model::Batch;
  if constexpr (detail::has_rows<B>::value) {
    (void)model;
    return static_cast<std::size_t>(mb.rows);
  } else if constexpr (detail::has_sequences<B>::value) {
    (void)model;
    return static_cast<std::size_t>(mb.B);
  } else {
    return model.input_extent(0, mb)[0];
  }
}

/// \brief Whether M calls a gradients-ready hook (the optional on_grads_ready member).
template <class M, class Exec>
inline constexpr bool has_grads_hook_v = detail::has_grads_hook<M, Exec>::value;
/// \brief Whether M names the parameters whose values it reads (on_values_needed and on_values_done).
template <class M, class Exec>
inline constexpr bool has_values_hooks_v = detail::has_values_hooks<M, Exec>::value;
/// \brief Whether M announces gradients before writing them (the optional on_grads_needed member).
template <class M, class Exec>
inline constexpr bool has_needed_hook_v = detail::has_needed_hook<M, Exec>::value;
/// \brief Whether M lists parameters tied to another stage (the optional tied_parameters member).
template <class M>
inline constexpr bool has_tied_parameters_v = detail::has_tied<M>::value;

/// \brief True when M is a stage module for Exec; otherwise a compile error that names the first
/// member missing (see the file comment for the contract). Use it as static_assert(check_stage_module<M, Exec>()).
template <class M, class Exec>
constexpr bool check_stage_module() {
  constexpr bool types = detail::has_types<M>::value;
  static_assert(types,
                "pmt stage module: the model lacks the member types value_type, Batch (one microbatch) and "
                "Activation (Tensor<T, 2, Exec>) (see pmt/parallel/stage_module.hpp)");
  if constexpr (types) {
    static_assert(
        std::is_same_v<typename M::Activation, Tensor<typename M::value_type, 2, Exec>>,
        "pmt stage module: M::Activation must be Tensor<M::value_type, 2, Exec> of the Trainer's execution space");
    static_assert(detail::has_topology<M>::value,
                  "pmt stage module: the model lacks int stage() const, int stages() const or int chunks() const");
    static_assert(detail::has_parameters<M, Exec>::value,
                  "pmt stage module: the model lacks std::vector<pmt::Parameter<T, Exec>*> parameters()");
    static_assert(detail::has_forward<M, Exec>::value,
                  "pmt stage module: the model lacks Activation forward_chunk(const Exec&, int chunk, const Batch&, "
                  "const Activation& x_in, double normaliser, double* loss)");
    static_assert(
        detail::has_backward<M, Exec>::value,
        "pmt stage module: the model lacks Activation backward_chunk(const Exec&, int chunk, const Activation& dy)");
    static_assert(
        detail::has_extents<M>::value,
        "pmt stage module: the model lacks std::array<std::size_t, 2> input_extent(int chunk, const Batch&) const "
        "or output_extent(int chunk, const Batch&) const");
  }
  return true;
}

/// \brief Sums the gradient of every tied parameter of `model` with its peer stage's copy over
/// the pp communicator `pp` (both end with the same sum, bit for bit: g + g' == g' + g); models
/// without tied_parameters() and pp = 1 do nothing. Call after the backward of every microbatch
/// (and after the data-parallel sync), before clipping and the optimizer.
/// \throws pmt::ConfigError for a peer outside [0, pp) or the stage itself.
template <class Exec, class Backend, class Model>
void finalize_grads(const Exec& exec, const comm::Communicator<Backend>& pp, Model& model) {
  if constexpr (has_tied_parameters_v<Model>) {
    if (pp.size() == 1) return;
    using T = typename Model::value_type;
    for (const auto& tied : model.tied_parameters()) {
      pmt::detail::require<ConfigError>(
          tied.param != nullptr && tied.peer >= 0 && tied.peer < pp.size() && tied.peer != pp.rank(),
          "pmt::parallel::finalize_grads", [&] {
            return pmt::detail::str("a tied parameter names peer stage ", tied.peer, " on stage ", pp.rank(), " of ",
                                    pp.size(), "; expected another stage of the pipeline");
          });
      auto& mine = tied.param->grad;
      auto other = workspace_view<Tensor<T, 1, Exec>>("pmt::parallel::finalize_grads::peer", mine.size());
      comm::Request rq, sq;  // one group: an exchange (NCCL's stream order, comm::group)
      comm::group(pp, exec, [&] {
        rq = comm::irecv(pp, exec, other, tied.peer, /*tag=*/7);
        sq = comm::isend(pp, exec, mine, tied.peer, 7);
      });
      rq.wait();
      sq.wait();
      ops::add(exec, mine, other, mine);
    }
  } else {
    (void)exec, (void)pp, (void)model;
  }
}

/// \brief Sums the gradients of the parameters marked tp_partial (sequence parallelism: each tp
/// rank holds its rows' part) over the tp communicator, packed into one all-reduce; every tp
/// rank ends with the same whole gradient. Nothing to do on tp = 1 or without such parameters.
/// Call once after the backward of every microbatch, before clipping and the optimizer (the
/// order with the data-parallel sum does not matter: both are sums).
template <class Exec, class Backend, class T>
void sum_partial_grads(const Exec& exec, const comm::Communicator<Backend>& tp,
                       const std::vector<Parameter<T, Exec>*>& params) {
  if (tp.size() == 1) return;
  std::size_t total = 0;
  for (const auto* p : params)
    if (p->tp_partial) total += p->size();
  if (total == 0) return;
  auto packed     = workspace_view<Tensor<T, 1, Exec>>("pmt::parallel::sum_partial_grads", total);
  const auto each = [&](auto&& move) {
    std::size_t at = 0;
    for (const auto* p : params)
      if (p->tp_partial) {
        move(p->grad, Kokkos::subview(packed, std::make_pair(at, at + p->size())));
        at += p->size();
      }
  };
  each([&](const auto& g, const auto& slot) { Kokkos::deep_copy(exec, slot, g); });
  comm::all_reduce(tp, exec, packed, comm::ReduceOp::Sum);
  each([&](const auto& g, const auto& slot) { Kokkos::deep_copy(exec, g, slot); });
}

}  // namespace pmt::parallel
