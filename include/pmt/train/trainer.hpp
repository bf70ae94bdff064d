// SPDX-License-Identifier: Apache-2.0
#pragma once
// Trainer: one training step of any stage module (parallel/stage_module.hpp: nn::Gpt,
// nn::StagedModel over a user's Chain and loss, or a user's class) over a dp x tp x pp Mesh:
//   zero grads -> the microbatches: with pp = 1 forward + loss + backward of each in turn, with
//   pp > 1 the pipeline schedule (GPipe or 1F1B, interleaved when the model holds several chunks
//   per stage; parallel/pipeline.hpp) over the stages; the gradients accumulate and the dp
//   all-reduces of each chunk's last microbatch start during its backward
//   -> finish the dp sync -> parallel::finalize_grads (tied parameters summed between stages)
//   -> clip by the global norm (over tp and pp) -> optimizer step with the scheduled learning rate.
// Each step() and evaluate() runs inside a WorkspaceScope (core/workspace.hpp): the first step
// allocates the activations, gradients and scratch it needs, every later step of the same shapes
// reuses them and allocates nothing.
// step() returns the global loss: the sum over dp ranks and microbatches of the per-batch losses,
// each already divided by the global token count the caller passes (the same on every rank).
// The policy (5th parameter) is a Hybrid<DataParallel<Mode>, TensorSplit<>, Pipeline<S, Schedule>>
// (any subset): it fixes the dp mode and the default schedule, and the Mesh must fit it (an axis
// the Hybrid does not name must have degree 1; Pipeline<S> needs pp = S). A bare Synchronous or
// LocalSgd<H> is accepted too, as Hybrid<DataParallel<Mode>, TensorSplit<>, Pipeline<>>.
// The dp mode names a data-parallel strategy (train/strategy.hpp): Synchronous (gradients summed
// over dp every step, optionally as bf16 with error feedback: train/dp_all_reduce.hpp; with a
// ZeRO optimizer, which shards over dp and moves the gradients itself: train/dp_zero.hpp),
// LocalSgd<H> and DiLoCo<H> (replicas train apart and meet every H steps: train/dp_local.hpp),
// BoundedStaleness<S> (gradient sums applied S steps late: train/dp_stale.hpp), or a user's mode
// with a nested strategy template. The Trainer calls the strategy's hooks at fixed points of the
// step and has no per-mode code; state() is the strategy's, for checkpoints.

#include "pmt/comm/agree.hpp"
#include "pmt/comm/collectives.hpp"
#include "pmt/comm/mesh.hpp"
#include "pmt/comm/progress.hpp"
#include "pmt/core/error.hpp"
#include "pmt/core/failure.hpp"
#include "pmt/core/instrument.hpp"
#include "pmt/core/parameter.hpp"
#include "pmt/core/precision.hpp"
#include "pmt/core/random.hpp"
#include "pmt/core/step_context.hpp"
#include "pmt/core/workspace.hpp"
#include "pmt/optim/clip.hpp"
#include "pmt/optim/zero.hpp"
#include "pmt/optim/zero2.hpp"
#include "pmt/optim/zero3.hpp"
#include "pmt/parallel/grad_sync.hpp"
#include "pmt/parallel/pipeline.hpp"
#include "pmt/parallel/schedule.hpp"
#include "pmt/parallel/stage_module.hpp"
#include "pmt/parallel/stale_sync.hpp"
#include "pmt/policy/hybrid.hpp"
#include "pmt/policy/policies.hpp"
#include "pmt/train/dp_all_reduce.hpp"
#include "pmt/train/dp_local.hpp"
#include "pmt/train/dp_stale.hpp"
#include "pmt/train/dp_zero.hpp"
#include "pmt/train/strategy.hpp"

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace pmt::train {

/// \brief One microbatch of a token model: B sequences of T tokens and their targets.
template <class Ids>
using Microbatch = parallel::Microbatch<Ids>;
/// \brief One microbatch of any other model: rows, their input and their targets.
template <class Input, class Target>
using Samples = parallel::Samples<Input, Target>;

/// \brief The strategy of pmt::Synchronous: bucketed all-reduce with a replicated optimizer,
/// ZeRO-1, ZeRO-2 or ZeRO-3 with a ZeRO optimizer (the optimizer shards over dp itself).
template <class Model, class Optimizer, class Exec, class Backend>
struct strategy_of<Synchronous, Model, Optimizer, Exec, Backend> {
  using type = std::conditional_t<
      optim::shards_params_v<Optimizer>, Zero3Strategy<Model, Optimizer, Exec, Backend>,
      std::conditional_t<optim::shards_grads_v<Optimizer>, Zero2Strategy<Model, Optimizer, Exec, Backend>,
                         std::conditional_t<Optimizer::shards_over_dp, Zero1Strategy<Model, Optimizer, Exec, Backend>,
                                            AllReduceStrategy<Model, Optimizer, Exec, Backend>>>>;
};

/// \brief What a Trainer's policy says: the dp mode, whether each axis may be > 1, the static
/// number of stages (pmt::dynamic: any) and the default schedule.
template <class Policy>
struct trainer_policy {  // a bare dp mode: every axis allowed, 1F1B
  using dp_mode            = Policy;
  static constexpr bool dp = true, tp = true, pp = true;
  static constexpr int stages = dynamic;
  static constexpr int chunks = dynamic;  ///< model chunks per stage the policy requires (dynamic: any)
  static constexpr parallel::ScheduleKind schedule = parallel::ScheduleKind::OneFOneB;
};
template <class... Ps>
struct trainer_policy<Hybrid<Ps...>> {
  using H   = Hybrid<Ps...>;
  using DpP = typename H::template get<Axis::dp>;
  using PpP = typename H::template get<Axis::pp>;
  template <class P, class = void>
  struct mode_of {
    using type = Synchronous;
  };
  template <class P>
  struct mode_of<P, std::void_t<typename P::mode>> {
    using type = typename P::mode;
  };
  template <class P, class = void>
  struct pipeline_of {
    static constexpr int stages = 1, chunks = dynamic;
    static constexpr parallel::ScheduleKind schedule = parallel::ScheduleKind::OneFOneB;
  };
  template <class S>
  static constexpr int chunks_of() {
    if constexpr (detail::is_interleaved_v<S>)
      return S::chunks;
    else
      return dynamic;
  }
  template <class P>
  struct pipeline_of<P, std::void_t<typename P::schedule>> {
    static constexpr int stages = P::stages;
    static constexpr int chunks = chunks_of<typename P::schedule>();
    static constexpr parallel::ScheduleKind schedule =
        std::is_same_v<typename P::schedule, GPipe> ? parallel::ScheduleKind::GPipe : parallel::ScheduleKind::OneFOneB;
  };
  using dp_mode            = typename mode_of<DpP>::type;
  static constexpr bool dp = H::has(Axis::dp), tp = H::has(Axis::tp), pp = H::has(Axis::pp);
  static constexpr int stages                      = pipeline_of<PpP>::stages;
  static constexpr int chunks                      = pipeline_of<PpP>::chunks;
  static constexpr parallel::ScheduleKind schedule = pipeline_of<PpP>::schedule;
};

/// \brief One training step of any stage module over a dp x tp x pp Mesh (see the file comment):
/// step(microbatches, options) returns the global loss; evaluate() the loss without an update.
/// \throws pmt::ConfigError when the mesh does not fit the policy, for no microbatch or a
/// non-positive normaliser; what the model and the optimizer throw.
template <class Model, class Optimizer, class Exec, class Backend, class Policy = Synchronous>
class Trainer {
  static_assert(parallel::check_stage_module<Model, Exec>());
  using policy = trainer_policy<Policy>;

 public:
  using DpMode = typename policy::dp_mode;
  /// \brief The data-parallel strategy of DpMode (train/strategy.hpp).
  using Strategy = strategy_of_t<DpMode, Model, Optimizer, Exec, Backend>;
  using T        = typename Model::value_type;
  using Batch    = typename Model::Batch;  ///< one microbatch of this dp rank

  /// \throws pmt::ConfigError when the mesh does not fit the policy, or from the strategy (e.g.
  /// gradient compression without synchronous gradients, outer options out of range).
  Trainer(const Mesh<Backend>& mesh, Model& model, Optimizer& opt, const Exec& exec = Exec(),
          TrainerOptions options = {})
      : m_mesh(checked(mesh, model, options)),
        m_model(model),
        m_opt(opt),
        m_exec(exec),
        m_options(std::move(options)),
        m_strategy(StrategyContext<Model, Optimizer, Exec, Backend>{mesh, model, opt, exec, m_options}),
        m_schedule(policy::schedule),
        m_precision(m_options.precision) {
    // a model that says when gradients are final lets the strategy's dp traffic overlap its
    // backward; one that also names them before writing lets it hold their storage only then
    if constexpr (parallel::has_grads_hook_v<Model, Exec>)
      m_model.on_grads_ready([this](const std::vector<Parameter<T, Exec>*>& ps) { m_strategy.grads_ready(ps); });
    if constexpr (Strategy::wants_grads_needed)
      m_model.on_grads_needed([this](const std::vector<Parameter<T, Exec>*>& ps) { m_strategy.grads_needed(ps); });
    if constexpr (Strategy::wants_values) {  // ZeRO-3: values gathered where a layer reads them
      m_model.on_values_needed([this](const std::vector<Parameter<T, Exec>*>& ps) { m_strategy.values_needed(ps); });
      m_model.on_values_done([this](const std::vector<Parameter<T, Exec>*>& ps) { m_strategy.values_done(ps); });
    }
    if (mesh.degree(Axis::pp) > 1) m_runner.emplace(mesh, model);
  }
  /// Frees the step memory the Workspace keeps that nothing holds any more.
  ~Trainer() { Workspace::instance().release(); }
  Trainer(const Trainer&)            = delete;  // the model's hook points at this object
  Trainer& operator=(const Trainer&) = delete;

  /// \brief One step over this rank's microbatches; returns the global loss. The step's random
  /// keys (Dropout's masks) are the global step (StepOptions::step, else steps()) and each row's
  /// index in the global batch (the dp ranks' rows in rank order, each rank's microbatches in
  /// order), so every layout and a resumed run draw what the one-rank, uninterrupted run draws.
  /// \throws pmt::ConfigError for no microbatch or a non-positive normaliser.
  double step(const std::vector<Batch>& microbatches, const StepOptions& o) {
    check_batch("pmt::train::Trainer::step", microbatches, o.normaliser);
    const std::int64_t global_step = o.step >= 0 ? o.step : steps();
    try {
      return run_step(microbatches, o, global_step);
    } catch (...) {  // the other ranks may wait for this one forever: record it (core/failure.hpp)
      if (!std::exchange(m_failed_alike, false))
        note_failure(failure_of(std::current_exception(), "step", global_step));
      throw;
    }
  }

  /// \brief The number of the next step(): the steps this Trainer has run, counted from the
  /// step a checkpoint restored (set_steps) or, for a Trainer that has not stepped yet, from the
  /// optimizer's update count (an optimizer loaded from a checkpoint continues its run's count).
  std::int64_t steps() const noexcept { return m_next_step >= 0 ? m_next_step : optimizer_steps(); }
  /// \brief Continue at step `next` (a program that keeps its own step count, e.g. a checkpoint's
  /// CheckpointInfo::step when its updates were skipped; StepOptions::step overrides per step).
  void set_steps(std::int64_t next) noexcept { m_next_step = next < 0 ? 0 : next; }

  /// \brief The global loss of the microbatches without changing the model (validation), in
  /// evaluation mode on every layout: Dropout is the identity, no layer keeps activations, no
  /// backward runs (a pipeline runs the forward-only schedule), nothing is synchronised over dp
  /// and the optimizer does not step.
  double evaluate(const std::vector<Batch>& microbatches, double normaliser) {
    check_batch("pmt::train::Trainer::evaluate", microbatches, normaliser);
    try {
      return run_evaluation(microbatches, normaliser);
    } catch (...) {  // as in step()
      if (!std::exchange(m_failed_alike, false))
        note_failure(failure_of(std::current_exception(), "evaluate", steps()));
      throw;
    }
  }

  /// \brief The state a checkpoint saves beside the optimizer's (io::save_checkpoint's last
  /// argument, and load_checkpoint's to restore it): the strategy's (DiLoCo's outer anchor and
  /// momentum, the residuals of compressed gradients, the stale sums in flight; empty for the
  /// others).
  ParameterStates<T, Exec> state() { return m_strategy.state(); }
  /// \brief The data-parallel strategy (its own accessors: grad_sync(), stale_sync(), period(), ...).
  const Strategy& strategy() const noexcept { return m_strategy; }
  /// \brief The precision of the model's float products in step() and evaluate().
  Precision precision() const noexcept { return m_precision; }
  /// \brief Bytes this rank has handed to dp collectives: the gradient buckets (half with bf16
  /// compression), LocalSgd's and DiLoCo's parameter averages, the stale sums. A ring all-reduce
  /// over dp ranks moves 2 (dp - 1) / dp times this over each rank's link.
  std::uint64_t dp_bytes_sent() const noexcept { return m_strategy.bytes_sent(); }
  /// \brief Whether the last step() applied an update (BoundedStaleness applies none in its
  /// first S steps; a skipped non-finite step counts as applied here: see last_step_skipped()).
  bool last_step_applied() const noexcept { return m_applied; }
  /// \brief BoundedStaleness: the gradient-sum machinery (strategy().stale_sync()).
  auto stale_sync() const noexcept { return m_strategy.stale_sync(); }
  /// \brief Synchronous all-reduce: the gradient buckets (strategy().grad_sync()).
  const auto& grad_sync() const noexcept { return m_strategy.grad_sync(); }
  /// \brief LocalSgd and DiLoCo: the averaging period (strategy().period()).
  int period() const noexcept { return m_strategy.period(); }
  /// \brief DiLoCo: the outer optimizer's options (strategy().outer_options()).
  const OuterOptions& outer_options() const noexcept { return m_strategy.outer_options(); }

  double last_grad_norm() const noexcept { return m_last_norm; }
  /// \brief Whether the last step() skipped its update (StepOptions::skip_nonfinite).
  bool last_step_skipped() const noexcept { return m_last_skipped; }
  /// \brief The pipeline schedule of the next steps (the policy's by default).
  void set_schedule(parallel::ScheduleKind kind) noexcept { m_schedule = kind; }
  parallel::ScheduleKind schedule() const noexcept { return m_schedule; }
  /// \brief The pipeline runner (pp > 1), for its statistics and checked tables; null otherwise.
  const parallel::PipelineRunner<Model, Exec, Backend>* pipeline() const noexcept {
    return m_runner ? &*m_runner : nullptr;
  }

 private:
  double run_step(const std::vector<Batch>& microbatches, const StepOptions& o, std::int64_t global_step) {
    const Instrument instrument("pmt::train::Trainer::step");
    const WorkspaceScope workspace;  // the step's memory: planned by the first step, reused by the next
    // the step's context, read by every layer: training, gradients kept, the step and this dp
    // rank's first global row keying random draws, fp32 or bf16 float products
    StepContext context;
    context.mode         = StepMode::train;
    context.grad         = true;
    context.random.step  = static_cast<std::uint64_t>(global_step);
    context.random.row0  = first_global_row(microbatches);
    context.random.keyed = true;
    context.precision    = m_precision;
    const StepScope step_scope(context);
    m_next_step = global_step + 1;
    m_strategy.begin_step(global_step);
    m_opt.zero_grad(m_exec);
    const double share = m_strategy.share();     // replicas that train apart: each its share of the tokens
    std::optional<comm::ProgressScope> polling;  // the strategy's communication moves at the model's progress points
    if constexpr (Strategy::polls) polling.emplace([this] { m_strategy.poll(); });
    const double loss = run_microbatches(microbatches, o.normaliser / share, /*dp_sync=*/true);
    polling.reset();
    m_strategy.finish_grads();
    const double total        = global_loss(loss / share);
    const bool bad_loss       = o.skip_nonfinite && !std::isfinite(total);
    const UpdateResult update = m_strategy.update(o, global_step, bad_loss);
    m_applied                 = update.applied;
    m_last_norm               = update.grad_norm;
    m_last_skipped            = update.skipped;
    m_strategy.end_step(global_step);
    if (!m_agreed_step) m_agreed_step = (comm::agree_choices(m_mesh.world(), m_exec), true);
    return total;
  }

  double run_evaluation(const std::vector<Batch>& microbatches, double normaliser) {
    const Instrument instrument("pmt::train::Trainer::evaluate");
    const WorkspaceScope workspace;
    StepContext context = step_context();  // the caller's, in evaluation mode with the Trainer's float products
    context.mode        = StepMode::eval;
    context.grad        = false;
    context.precision   = m_precision;
    const StepScope step_scope(context);
    m_strategy.begin_eval();
    const double loss = run_microbatches(microbatches, normaliser, /*dp_sync=*/false);
    m_strategy.end_eval();
    m_opt.zero_grad(m_exec);  // a model that writes gradients in its forward leaves none behind
    const double total = global_loss(loss);
    if (!m_agreed_eval) m_agreed_eval = (comm::agree_choices(m_mesh.world(), m_exec), true);
    return total;
  }

  /// What note_failure records for an exception that left step() or evaluate(): the rank and its
  /// place in the mesh, the step, the pipeline action that failed, and the error's message.
  std::string failure_of(const std::exception_ptr& error, const char* op, std::int64_t step) const {
    const std::string what = detail::message_of(error);
    const std::string at   = m_runner ? m_runner->failed_at() : std::string();
    return detail::str("Trainer::", op, " of step ", step, " on ", m_mesh.where(), at.empty() ? "" : ", ", at, ": ",
                       what);
  }

  static void check_batch(const char* op, const std::vector<Batch>& microbatches, double normaliser) {
    detail::require<ConfigError>(!microbatches.empty() && normaliser > 0, op, [&] {
      return detail::str(microbatches.size(), " microbatches and normaliser ", normaliser,
                         "; expected at least one microbatch and a positive token count");
    });
  }
  /// Forward and backward of every microbatch (the pipeline schedule with pp > 1; forward only
  /// without gradients); with dp_sync the dp all-reduces start during the last microbatch's
  /// backward. Each microbatch's forward runs with its first global row as the random row key.
  /// Returns this rank's loss sum.
  double run_microbatches(const std::vector<Batch>& microbatches, double normaliser, bool dp_sync) {
    const std::uint64_t first_row = step_context().random.row0;
    if (m_runner) {
      try {
        return m_runner->run(
            m_exec, m_schedule, microbatches, normaliser,
            [this, dp_sync](int, bool last) { m_strategy.arm(dp_sync && last); }, first_row);
      } catch (...) {  // the runner's checks raise on every stage alike: no rank is left waiting
        m_failed_alike = !m_runner->started();
        throw;
      }
    }
    double loss         = 0;
    const int chunks    = m_model.chunks();
    const bool backward = step_context().grad;
    std::uint64_t row0  = first_row;
    for (std::size_t i = 0; i < microbatches.size(); ++i) {
      m_strategy.arm(dp_sync && i + 1 == microbatches.size());
      typename Model::Activation x;
      {
        const RandomRowScope rows(row0);
        for (int k = 0; k < chunks; ++k) x = m_model.forward_chunk(m_exec, k, microbatches[i], x, normaliser, &loss);
      }
      if (backward)
        for (int k = chunks - 1; k >= 0; --k) x = m_model.backward_chunk(m_exec, k, x);
      row0 += parallel::rows_of(m_model, microbatches[i]);
    }
    return loss;
  }
  /// The global index of this dp rank's first row: the rows of the dp ranks before it (every rank
  /// of a dp group holds the same rows; one small host all-reduce over dp when dp > 1).
  std::uint64_t first_global_row(const std::vector<Batch>& microbatches) const {
    const auto& dp = m_mesh.comm(Axis::dp);
    if (dp.size() == 1) return 0;
    std::uint64_t mine = 0;
    for (const auto& mb : microbatches) mine += parallel::rows_of(m_model, mb);
    auto counts = workspace_view<Kokkos::View<double*, Kokkos::HostSpace>>("pmt::train::rows",
                                                                           static_cast<std::size_t>(dp.size()));
    for (std::size_t r = 0; r < counts.size(); ++r) counts(r) = 0;
    counts(static_cast<std::size_t>(dp.rank())) = static_cast<double>(mine);  // exact below 2^53 rows
    comm::all_reduce_host_values(dp, m_exec, counts);
    std::uint64_t before = 0;
    for (int r = 0; r < dp.rank(); ++r) before += static_cast<std::uint64_t>(counts(static_cast<std::size_t>(r)));
    return before;
  }
  /// The optimizer's update count (0 for an optimizer without steps()).
  template <class O, class = void>
  struct has_steps : std::false_type {};
  template <class O>
  struct has_steps<O, std::void_t<decltype(std::int64_t(std::declval<const O&>().steps()))>> : std::true_type {};
  std::int64_t optimizer_steps() const noexcept {
    if constexpr (has_steps<Optimizer>::value)
      return static_cast<std::int64_t>(m_opt.steps());
    else
      return 0;
  }
  /// The sum over dp and pp of each rank's loss (only the last stage's is non-zero).
  double global_loss(double local) const {
    auto total = workspace_view<Kokkos::View<double, Kokkos::HostSpace>>("pmt::train::loss");
    total()    = local;
    comm::all_reduce_host_values(m_mesh.comm(Axis::dp), m_exec, total);
    if (m_mesh.degree(Axis::pp) > 1) comm::all_reduce_host_values(m_mesh.comm(Axis::pp), m_exec, total);
    return total();
  }
  // What the policy fixes about the model's activations (pmt::activation_policy) and the queries
  // that let the Trainer see the model agrees.
  using activations = activation_policy<Policy>;
  template <class M, class = void>
  struct has_sequence_query : std::false_type {};
  template <class M>
  struct has_sequence_query<M, std::void_t<decltype(bool(std::declval<const M&>().sequence_parallel()))>>
      : std::true_type {};
  template <class M, class = void>
  struct has_recompute_query : std::false_type {};
  template <class M>
  struct has_recompute_query<M, std::void_t<decltype(bool(std::declval<const M&>().recomputes()))>> : std::true_type {};
  template <class M, class = void>
  struct has_selective_query : std::false_type {};
  template <class M>
  struct has_selective_query<M, std::void_t<decltype(bool(std::declval<const M&>().recomputes_attention()))>>
      : std::true_type {};
  static_assert(!activations::sequence_parallel || has_sequence_query<Model>::value,
                "pmt::train::Trainer: the policy has TensorSplit<Sequence>, and the model has no "
                "`bool sequence_parallel() const` saying whether it runs sequence-parallel (nn::Gpt has)");
  static_assert(!activations::full || has_recompute_query<Model>::value,
                "pmt::train::Trainer: the policy has Recompute<Full>, and the model has no `bool recomputes() const` "
                "saying whether it recomputes (nn::Gpt and nn::StagedModel have)");
  static_assert(
      !activations::selective || has_selective_query<Model>::value,
      "pmt::train::Trainer: the policy has Recompute<Selective>, and the model has no "
      "`bool recomputes_attention() const` (nn::Gpt has; a StagedModel recomputes whole chunks: Recompute<Full>)");

  /// The model must do what the policy fixes, on every rank; a rank that differs raises the error
  /// and the others learn of it (collective over the mesh's world, only where the policy fixes
  /// something), so none goes on into a step the others will not run.
  static void check_activations(const Mesh<Backend>& mesh, const Model& model) {
    if constexpr (activations::sequence_parallel || activations::fixes_recompute) {
      std::exception_ptr err;
      try {
        const int stage = mesh.coord(Axis::pp);
        const std::string build =
            "; build the model with the policy's options (nn::gpt_options<Policy>(mesh) or "
            "nn::staged_options<Policy>(mesh))";
        if constexpr (activations::sequence_parallel)
          detail::require<ConfigError>(
              mesh.degree(Axis::tp) == 1 || model.sequence_parallel(), "pmt::train::Trainer", [&] {
                return detail::str("the policy has TensorSplit<Sequence> and tp = ", mesh.degree(Axis::tp),
                                   ", but the model does not run sequence-parallel", build);
              });
        if constexpr (activations::fixes_recompute) {
          using R          = typename Policy::recompute;
          const bool want  = activations::recomputes_on(stage);
          const char* kind = activations::full ? "Full" : "Selective";
          bool full = false, selective = false;
          if constexpr (has_recompute_query<Model>::value) full = model.recomputes();
          if constexpr (has_selective_query<Model>::value) selective = model.recomputes_attention();
          const bool agree = activations::full ? full == want : (selective == want && !full);
          detail::require<ConfigError>(agree, "pmt::train::Trainer", [&] {
            return detail::str("the policy's Recompute<", kind,
                               R::stages > 0 ? detail::str(", ", R::stages) : std::string(), "> has pipeline stage ",
                               stage, want ? " recompute " : " recompute nothing",
                               want ? (activations::full ? "whole blocks" : "the attention core") : "",
                               ", but the model on it recomputes ",
                               full ? "whole blocks" : (selective ? "the attention core" : "nothing"), build);
          });
        }
      } catch (...) {
        err = std::current_exception();
      }
      comm::agree_on_errors(mesh.world(), err, "pmt::train::Trainer", "checking the model against the policy");
    } else {
      (void)mesh, (void)model;
    }
  }

  /// What does not fit between the policy's axes and the mesh the ranks were launched as, each
  /// with both numbers and the fix ("" when they fit).
  static std::string launch_mismatch(const MeshShape& s) {
    const int ranks = s.dp * s.tp * s.pp;
    std::string why;
    const auto add  = [&](const std::string& one) { why += (why.empty() ? "" : "; ") + one; };
    const auto axis = [&](bool has, int degree, const char* name, const char* policy_name) {
      if (has || degree == 1) return;
      add(detail::str("the mesh has ", name, " ", degree, " but the policy has no ", policy_name, ": add ", policy_name,
                      " to the policy's Hybrid, or launch ", ranks / degree, " rank(s) so that ", name, " is 1"));
    };
    axis(policy::dp, s.dp, "dp", "DataParallel<>");
    axis(policy::tp, s.tp, "tp", "TensorSplit<>");
    axis(policy::pp, s.pp, "pp", "Pipeline<>");
    if (policy::pp && policy::stages != dynamic && policy::stages != s.pp)
      add(detail::str("the policy's Pipeline<", policy::stages, "> needs pp ", policy::stages, " but the mesh has pp ",
                      s.pp, ": launch ", ranks / s.pp * policy::stages, " rank(s) (dp ", s.dp, " x tp ", s.tp, " x pp ",
                      policy::stages, "), make the mesh's pp ", policy::stages, ", or use Pipeline<", s.pp,
                      "> or Pipeline<> (any pp)"));
    if (why.empty()) return why;
    return detail::str("the ranks were launched as dp(", s.dp, ") x tp(", s.tp, ") x pp(", s.pp, ") = ", ranks,
                       " rank(s), which the policy does not fit: ", why);
  }

  static const Mesh<Backend>& checked(const Mesh<Backend>& mesh, const Model& model, const TrainerOptions& options) {
    detail::require<ConfigError>(
        options.precision == Precision::fp32 || std::is_same_v<typename Model::value_type, float>,
        "pmt::train::Trainer", [&] {
          return detail::str("precision bf16 rounds float products; this model's parameters are ",
                             sizeof(typename Model::value_type) * 8, "-bit. Use a float model or fp32");
        });
    if constexpr (policy::chunks != dynamic)
      detail::require<ConfigError>(model.chunks() == policy::chunks, "pmt::train::Trainer", [&] {
        return detail::str("the policy's schedule is Interleaved<", policy::chunks, "> but the model holds ",
                           model.chunks(), " chunks per stage; build it with ", policy::chunks, " chunks");
      });
    else
      (void)model;
    check_activations(mesh, model);
    const std::string why = launch_mismatch(mesh.shape());
    detail::require<ConfigError>(why.empty(), "pmt::train::Trainer", [&] { return why; });
    return mesh;
  }

  const Mesh<Backend>& m_mesh;
  Model& m_model;
  Optimizer& m_opt;
  Exec m_exec;
  TrainerOptions m_options;  // the strategy keeps a reference
  Strategy m_strategy;
  parallel::ScheduleKind m_schedule;
  std::optional<parallel::PipelineRunner<Model, Exec, Backend>> m_runner;
  Precision m_precision;
  double m_last_norm       = 0;
  bool m_last_skipped      = false;
  bool m_failed_alike      = false;  // the error in flight was raised on every rank alike
  std::int64_t m_next_step = -1;     // the next step's number; -1: the optimizer's update count
  bool m_applied           = true;   // the last step applied an update
  // whether the first step / evaluation has agreed the measured choices (matmul paths) over the
  // world: every rank takes the same paths from then on (core/measured_choice.hpp)
  bool m_agreed_step = false, m_agreed_eval = false;
};

}  // namespace pmt::train
