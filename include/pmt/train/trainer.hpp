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
// DpMode: Synchronous (gradients summed over dp every step, optionally as bf16 with error
// feedback: TrainerOptions::sync, parallel/grad_sync.hpp), LocalSgd<H> (no gradient
// communication; each replica normalises by its share of the tokens, normaliser / dp, and the
// parameters are averaged over dp every H steps; optimizer state stays local, so with plain SGD
// and H = 1 this is synchronous DP) or DiLoCo<H> (as LocalSgd<H>, but every H steps an outer
// step: with the anchor A (the parameters all replicas started the period from) and the dp
// average x of the replicas' parameters, delta = A - x, m = mu m + delta, A -= lr (delta + mu m)
// (Nesterov; A -= lr m without), and every replica continues from A; the inner optimizer's state
// stays local). A period ends after global steps H - 1, 2H - 1, ... (StepOptions::step; by
// default the number of step() calls), so a resumed run keeps the phase. LocalSgd<> and DiLoCo<>
// take H at run time (TrainerOptions::period). BoundedStaleness<S>: each step starts the dp sum of
// its gradients without waiting and applies the sum started S steps before (parallel/
// stale_sync.hpp); no update in the first S steps. state() shows checkpoints what these modes
// keep: DiLoCo's anchor and outer momentum, the residuals of compressed gradients, the stale sums.
// ZeRO optimizers (shards_over_dp) reduce-scatter themselves. ZeRO-2 (optim::Zero2AdamW,
// shards_grads) also owns the gradients' storage: the Trainer passes it the model's gradient hooks
// (on_grads_needed, on_grads_ready), so each bucket of gradients exists only while written and is
// reduce-scattered as soon as it is final, and the tied and sequence-parallel sums run on its
// shards (finish_grads) instead of finalize_grads / sum_partial_grads.

#include "pmt/comm/agree.hpp"
#include "pmt/comm/collectives.hpp"
#include "pmt/comm/mesh.hpp"
#include "pmt/core/error.hpp"
#include "pmt/core/instrument.hpp"
#include "pmt/core/parameter.hpp"
#include "pmt/core/precision.hpp"
#include "pmt/core/random.hpp"
#include "pmt/core/step_context.hpp"
#include "pmt/core/workspace.hpp"
#include "pmt/optim/clip.hpp"
#include "pmt/optim/zero.hpp"
#include "pmt/optim/zero2.hpp"
#include "pmt/parallel/grad_sync.hpp"
#include "pmt/parallel/pipeline.hpp"
#include "pmt/parallel/schedule.hpp"
#include "pmt/parallel/stage_module.hpp"
#include "pmt/parallel/stale_sync.hpp"
#include "pmt/policy/hybrid.hpp"
#include "pmt/policy/policies.hpp"

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace pmt::detail {

/// DiLoCo's outer step on one parameter (train/trainer.hpp): delta = a - x, m = mu m + delta,
/// a -= lr (delta + mu m) (Nesterov) or lr m, x = a. A free function: CUDA's extended lambdas may
/// not sit in a private member.
template <class Exec, class V>
void outer_update(const Exec& exec, const V& x, const V& a, const V& m, typename V::non_const_value_type lr,
                  typename V::non_const_value_type mu, bool nesterov) {
  using T = typename V::non_const_value_type;
  Kokkos::parallel_for(
      "pmt::train::Trainer::outer_step", Kokkos::RangePolicy<Exec>(exec, 0, x.size()), KOKKOS_LAMBDA(std::size_t k) {
        const T delta = a(k) - x(k);
        m(k)          = mu * m(k) + delta;
        a(k) -= lr * (nesterov ? delta + mu * m(k) : m(k));
        x(k) = a(k);
      });
}

}  // namespace pmt::detail

namespace pmt::train {

/// \brief One microbatch of a token model: B sequences of T tokens and their targets.
template <class Ids>
using Microbatch = parallel::Microbatch<Ids>;
/// \brief One microbatch of any other model: rows, their input and their targets.
template <class Input, class Target>
using Samples = parallel::Samples<Input, Target>;

/// \brief Step options.
struct StepOptions {
  double normaliser = 1.0;  ///< the global number of target tokens of the step (all dp ranks, all microbatches)
  double lr         = 1e-3;
  double max_norm   = 1.0;  ///< clip the global gradient norm to this (<= 0: no clipping)
  /// Skip the optimizer update when the global loss or gradient norm is nan or inf (as
  /// mixed-precision trainers skip overflowed steps); last_step_skipped() tells. Both values are
  /// global, so every rank skips alike.
  bool skip_nonfinite = false;
  /// The global step number: keys layout-independent random draws (Dropout) through the
  /// RandomContext. -1: the number of step() calls this Trainer made before (set it after a
  /// resume, so that the masks continue where the saved run stopped).
  std::int64_t step = -1;
};

/// \brief What a data-parallel mode is: whether replicas train apart between averages (LocalSgd,
/// DiLoCo), whether an outer step follows the average (DiLoCo), whether gradient sums arrive late
/// (BoundedStaleness), and the static period or bound (pmt::dynamic: TrainerOptions::period or
/// ::staleness; 0 for Synchronous).
template <class Mode>
struct dp_mode_traits {
  static constexpr bool local = false, diloco = false, stale = false;
  static constexpr int period = 0;
};
template <int H>
struct dp_mode_traits<LocalSgd<H>> {
  static constexpr bool local = true, diloco = false, stale = false;
  static constexpr int period = H;
};
template <int H>
struct dp_mode_traits<DiLoCo<H>> {
  static constexpr bool local = true, diloco = true, stale = false;
  static constexpr int period = H;
};
/// BoundedStaleness<S>: `period` is the bound S.
template <int S>
struct dp_mode_traits<BoundedStaleness<S>> {
  static constexpr bool local = false, diloco = false, stale = true;
  static constexpr int period = S;
};

/// \brief DiLoCo's outer optimizer: SGD with (Nesterov) momentum on the averaged parameter change
/// (the defaults are the DiLoCo paper's). \throws nothing; Trainer checks lr > 0, 0 <= momentum < 1.
struct OuterOptions {
  double lr       = 0.7;
  double momentum = 0.9;
  bool nesterov   = true;
};

/// \brief A Trainer's settings beyond the policy: the dp gradient buckets and their compression,
/// and DiLoCo's outer optimizer. Converts from a bucket size or GradSyncOptions.
struct TrainerOptions {
  parallel::GradSyncOptions sync;
  OuterOptions outer;
  int period    = 0;  ///< the period of LocalSgd<> and DiLoCo<> (their run-time form), >= 1
  int staleness = 0;  ///< the bound S of BoundedStaleness<> (its run-time form), >= 0
  /// The precision of the model's float products in step() and evaluate(): bf16 runs them as
  /// ops::matmul_bf16 (operands rounded to bf16, fp32 sums) inside a PrecisionScope; parameters,
  /// gradients, optimizer state and the other ops stay in the model's type (fp32 masters).
  Precision precision = Precision::fp32;
  TrainerOptions()    = default;
  TrainerOptions(std::size_t bucket_bytes) : sync(bucket_bytes) {}
  TrainerOptions(parallel::GradSyncOptions s) : sync(s) {}
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
    if constexpr (policy_detail::is_interleaved_v<S>)
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
  using policy                = trainer_policy<Policy>;
  using DpMode                = typename policy::dp_mode;
  using mode                  = dp_mode_traits<DpMode>;
  static constexpr bool local = mode::local, diloco = mode::diloco;  // replicas apart between averages; outer step
  static constexpr bool stale = mode::stale;                         // gradient sums applied S steps late
  static_assert(std::is_same_v<DpMode, Synchronous> || local || stale,
                "pmt::train::Trainer: DpMode must be pmt::Synchronous, pmt::LocalSgd<H>, pmt::DiLoCo<H> or "
                "pmt::BoundedStaleness<S>");
  // whether the dp gradient buckets are used: ZeRO reduce-scatters itself, local SGD does not sync
  static constexpr bool syncs_gradients = !Optimizer::shards_over_dp && !local && !stale;
  static_assert(!(stale && Optimizer::shards_over_dp),
                "pmt::train::Trainer: bounded staleness applies whole gradient sums late; a ZeRO optimizer "
                "reduce-scatters them itself. Use one or the other");
  static constexpr bool shards_grads = optim::shards_grads_v<Optimizer>;  // ZeRO-2
  static_assert(!(local && Optimizer::shards_over_dp),
                "pmt::train::Trainer: local SGD and DiLoCo keep replicas apart between averages; a ZeRO "
                "optimizer needs synchronous gradients. Use one or the other");

 public:
  using T     = typename Model::value_type;
  using Batch = typename Model::Batch;  ///< one microbatch of this dp rank

  /// \throws pmt::ConfigError for gradient compression without synchronous gradients, or outer
  /// options out of range.
  Trainer(const Mesh<Backend>& mesh, Model& model, Optimizer& opt, const Exec& exec = Exec(),
          TrainerOptions options = {})
      : m_mesh(checked(mesh, model, options)),
        m_model(model),
        m_opt(opt),
        m_exec(exec),
        m_sync(mesh.comm(Axis::dp), syncs_gradients ? model.parameters() : std::vector<Parameter<T, Exec>*>{},
               options.sync),
        m_schedule(policy::schedule),
        m_outer(options.outer),
        m_precision(options.precision),
        m_period(!local                    ? 0
                 : mode::period == dynamic ? options.period
                                           : mode::period) {
    if constexpr (diloco)
      for (auto* p : model.parameters()) {
        m_anchor.emplace_back("pmt::train::Trainer::outer_anchor", p->size());
        m_momentum.emplace_back("pmt::train::Trainer::outer_momentum", p->size());
      }
    // a model that says when gradients are final lets the dp all-reduces overlap its backward;
    // otherwise they all start in finish()
    if constexpr (stale)
      m_stale.emplace(mesh.comm(Axis::dp), model.parameters(),
                      mode::period == dynamic ? options.staleness : mode::period);
    if constexpr (parallel::has_grads_hook_v<Model, Exec>)
      m_model.on_grads_ready([this](const std::vector<Parameter<T, Exec>*>& ps) {
        m_sync.ready(m_exec, ps);
        if constexpr (shards_grads) m_opt.grads_ready(m_exec, ps);  // ZeRO-2: the bucket's reduce-scatter starts
        if constexpr (stale) m_stale->progress();                   // the sums in flight move on during backward
      });
    if constexpr (shards_grads) {
      check_tied(model, opt);
      // a model that names gradients before writing them lets ZeRO-2 hold each bucket only then;
      // one that does not keeps them all from zero_grad() to the step
      constexpr bool announces = parallel::has_needed_hook_v<Model, Exec> && parallel::has_grads_hook_v<Model, Exec>;
      m_opt.announce_grads(announces);
      if constexpr (announces)
        m_model.on_grads_needed([this](const std::vector<Parameter<T, Exec>*>& ps) { m_opt.grads_needed(m_exec, ps); });
    }
    if (mesh.degree(Axis::pp) > 1) m_runner.emplace(mesh, model);
  }
  /// Frees the step memory the Workspace keeps that nothing holds any more.
  ~Trainer() { Workspace::instance().release(); }
  Trainer(const Trainer&)            = delete;  // the model's hook points at this object
  Trainer& operator=(const Trainer&) = delete;

  /// \brief One step over this rank's microbatches; returns the global loss.
  /// \throws pmt::ConfigError for no microbatch or a non-positive normaliser.
  double step(const std::vector<Batch>& microbatches, const StepOptions& o) {
    check_batch("pmt::train::Trainer::step", microbatches, o.normaliser);
    const Instrument instrument("pmt::train::Trainer::step");
    const WorkspaceScope workspace;  // the step's memory: planned by the first step, reused by the next
    const std::int64_t global_step = o.step >= 0 ? o.step : m_calls;
    // the step's context, read by every layer: training, gradients kept, the step keying
    // Dropout's masks, fp32 or bf16 float products
    StepContext context;
    context.mode        = StepMode::train;
    context.grad        = true;
    context.random.step = static_cast<std::uint64_t>(global_step);
    context.precision   = m_precision;
    const StepScope step_scope(context);
    ++m_calls;
    if constexpr (diloco)
      if (!m_anchored) {  // the period starts from the parameters as they are now (or as loaded)
        const auto ps = m_model.parameters();
        for (std::size_t i = 0; i < ps.size(); ++i) Kokkos::deep_copy(m_exec, m_anchor[i], ps[i]->value);
        m_anchored = true;
      }
    m_opt.zero_grad(m_exec);
    const int dp            = m_mesh.degree(Axis::dp);
    const double normaliser = local ? o.normaliser / dp : o.normaliser;
    // ZeRO optimizers reduce-scatter the gradients themselves; local SGD does not sync them.
    const double loss = run_microbatches(microbatches, normaliser, syncs_gradients);
    m_sync.finish(m_exec);
    if constexpr (shards_grads) {
      m_opt.finish_grads(m_exec);  // ZeRO-2: the same sums, on the gradient shards
    } else {
      parallel::finalize_grads(m_exec, m_mesh.comm(Axis::pp),
                               m_model);  // tied copies on two stages sum their gradients
      parallel::sum_partial_grads(m_exec, m_mesh.comm(Axis::tp),
                                  m_model.parameters());  // sequence parallelism: rows' parts summed
    }
    const double total  = global_loss(local ? loss / dp : loss);
    const bool bad_loss = o.skip_nonfinite && !std::isfinite(total);
    m_applied           = true;
    if constexpr (stale) {
      // this step's sum starts; the one of S steps before arrives (none yet in the first S steps)
      m_applied = m_stale->exchange(m_exec, global_step);
      if (!m_applied) {
        m_last_norm = 0, m_last_skipped = false;
        if (!m_agreed_step) m_agreed_step = (comm::agree_choices(m_mesh.world(), m_exec), true);
        return total;
      }
    }
    if constexpr (Optimizer::shards_over_dp) {
      m_last_norm    = m_opt.step(m_exec, o.lr, o.max_norm, o.skip_nonfinite, bad_loss);
      m_last_skipped = bad_loss || (o.skip_nonfinite && !std::isfinite(m_last_norm));
    } else {
      m_last_norm    = optim::clip_grad_norm(m_exec, m_model.parameters(), m_mesh.comm(Axis::tp), o.max_norm,
                                             &m_mesh.comm(Axis::pp));
      m_last_skipped = bad_loss || (o.skip_nonfinite && !std::isfinite(m_last_norm));
      if (!m_last_skipped) m_opt.step(m_exec, o.lr);
    }
    if constexpr (local) {
      if ((global_step + 1) % m_period == 0) {
        if (dp > 1)
          for (auto* p : m_model.parameters()) {
            comm::all_reduce(m_mesh.comm(Axis::dp), m_exec, p->value, comm::ReduceOp::Avg);
            m_average_bytes += p->bytes();
          }
        if constexpr (diloco) outer_step();
      }
    }
    if (!m_agreed_step) m_agreed_step = (comm::agree_choices(m_mesh.world(), m_exec), true);
    return total;
  }

  /// \brief The global loss of the microbatches without changing the model (validation): the same
  /// forward and backward as step() (so any layout and schedule works), no gradient sync, no
  /// optimizer step; the gradients are cleared afterwards.
  double evaluate(const std::vector<Batch>& microbatches, double normaliser) {
    check_batch("pmt::train::Trainer::evaluate", microbatches, normaliser);
    const WorkspaceScope workspace;
    StepContext context = step_context();  // the caller's, with the Trainer's float products
    context.precision   = m_precision;
    const StepScope step_scope(context);
    if constexpr (shards_grads) {  // ZeRO-2: storage for the gradients; buckets dropped, not reduced
      m_opt.zero_grad(m_exec);
      m_opt.collect_grads(false);
    }
    const double loss = run_microbatches(microbatches, normaliser, /*dp_sync=*/false);
    if constexpr (shards_grads) m_opt.collect_grads(true);
    m_opt.zero_grad(m_exec);
    const double total = global_loss(loss);
    if (!m_agreed_eval) m_agreed_eval = (comm::agree_choices(m_mesh.world(), m_exec), true);
    return total;
  }

  /// \brief The state a checkpoint saves beside the optimizer's (io::save_checkpoint's last
  /// argument, and load_checkpoint's to restore it): DiLoCo's "outer_anchor" (loaded as the
  /// parameters when a checkpoint lacks it) and "outer_momentum"; with compressed gradients the
  /// "grad_residual" of each parameter (a rank's own); with BoundedStaleness the S gradient sums
  /// not yet applied, "stale_grad_0" ... (completing those in flight: collective over dp; resume
  /// with StepOptions::step). Empty for the other modes.
  ParameterStates<T, Exec> state() {
    ParameterStates<T, Exec> st;
    if constexpr (diloco) {
      st.states.push_back({"outer_anchor", m_anchor, true});
      st.states.push_back({"outer_momentum", m_momentum, false});
      st.loaded = &m_anchored;
    }
    if constexpr (stale) {
      for (auto& x : m_stale->states()) st.states.push_back(std::move(x));
      st.loaded = m_stale->loaded_flag();
    }
    if (m_sync.compression() != parallel::GradCompression::none && m_mesh.degree(Axis::dp) > 1) {
      typename ParameterStates<T, Exec>::State r{"grad_residual", {}, false};
      for (auto* p : m_model.parameters()) r.of.push_back(m_sync.residual(p));
      st.states.push_back(std::move(r));
    }
    return st;
  }
  const OuterOptions& outer_options() const noexcept { return m_outer; }
  /// \brief The precision of the model's float products in step() and evaluate().
  Precision precision() const noexcept { return m_precision; }
  /// \brief Bytes this rank has handed to dp all-reduces: the gradient buckets (GradSync, half
  /// with bf16 compression) and LocalSgd's and DiLoCo's parameter averages. A ring all-reduce over
  /// dp ranks moves 2 (dp - 1) / dp times this over each rank's link.
  std::uint64_t dp_bytes_sent() const noexcept {
    return m_sync.bytes_sent() + m_average_bytes + (m_stale ? m_stale->bytes_sent() : 0);
  }
  /// \brief Whether the last step() applied an update (BoundedStaleness applies none in its
  /// first S steps; a skipped non-finite step counts as applied here: see last_step_skipped()).
  bool last_step_applied() const noexcept { return m_applied; }
  /// \brief BoundedStaleness: the gradient-sum machinery (its bound, the last applied sum's age);
  /// null for the other modes.
  const parallel::StaleSync<T, Exec, Backend>* stale_sync() const noexcept { return m_stale ? &*m_stale : nullptr; }
  /// \brief The averaging period of LocalSgd and DiLoCo (0: synchronous).
  int period() const noexcept { return m_period; }

  double last_grad_norm() const noexcept { return m_last_norm; }
  /// \brief Whether the last step() skipped its update (StepOptions::skip_nonfinite).
  bool last_step_skipped() const noexcept { return m_last_skipped; }
  const parallel::GradSync<T, Exec, Backend>& grad_sync() const noexcept { return m_sync; }
  /// \brief The pipeline schedule of the next steps (the policy's by default).
  void set_schedule(parallel::ScheduleKind kind) noexcept { m_schedule = kind; }
  parallel::ScheduleKind schedule() const noexcept { return m_schedule; }
  /// \brief The pipeline runner (pp > 1), for its statistics and checked tables; null otherwise.
  const parallel::PipelineRunner<Model, Exec, Backend>* pipeline() const noexcept {
    return m_runner ? &*m_runner : nullptr;
  }

 private:
  static void check_batch(const char* op, const std::vector<Batch>& microbatches, double normaliser) {
    detail::require<ConfigError>(!microbatches.empty() && normaliser > 0, op, [&] {
      return detail::str(microbatches.size(), " microbatches and normaliser ", normaliser,
                         "; expected at least one microbatch and a positive token count");
    });
  }
  /// Forward and backward of every microbatch (the pipeline schedule with pp > 1); with dp_sync
  /// the dp all-reduces start during the last microbatch's backward. Returns this rank's loss sum.
  double run_microbatches(const std::vector<Batch>& microbatches, double normaliser, bool dp_sync) {
    if (m_runner)
      return m_runner->run(m_exec, m_schedule, microbatches, normaliser,
                           [this, dp_sync](int, bool last) { m_sync.arm(dp_sync && last); });
    double loss      = 0;
    const int chunks = m_model.chunks();
    for (std::size_t i = 0; i < microbatches.size(); ++i) {
      m_sync.arm(dp_sync && i + 1 == microbatches.size());
      typename Model::Activation x;
      for (int k = 0; k < chunks; ++k) x = m_model.forward_chunk(m_exec, k, microbatches[i], x, normaliser, &loss);
      for (int k = chunks - 1; k >= 0; --k) x = m_model.backward_chunk(m_exec, k, x);
    }
    return loss;
  }
  /// The sum over dp and pp of each rank's loss (only the last stage's is non-zero).
  double global_loss(double local) const {
    auto total = workspace_view<Kokkos::View<double, Kokkos::HostSpace>>("pmt::train::loss");
    total()    = local;
    comm::all_reduce_host_values(m_mesh.comm(Axis::dp), m_exec, total);
    if (m_mesh.degree(Axis::pp) > 1) comm::all_reduce_host_values(m_mesh.comm(Axis::pp), m_exec, total);
    return total();
  }
  /// DiLoCo's outer step on the averaged parameters (see the file comment); every replica
  /// continues from the new anchor.
  void outer_step() {
    const auto ps = m_model.parameters();
    const T lr = static_cast<T>(m_outer.lr), mu = static_cast<T>(m_outer.momentum);
    const bool nesterov = m_outer.nesterov;
    for (std::size_t i = 0; i < ps.size(); ++i)
      detail::outer_update(m_exec, ps[i]->value, m_anchor[i], m_momentum[i], lr, mu, nesterov);
  }
  /// ZeRO-2 sums tied gradients on its shards, so it must know the model's tied parameters.
  static void check_tied(Model& model, const Optimizer& opt) {
    if constexpr (parallel::has_tied_parameters_v<Model>) {
      const auto want  = model.tied_parameters();
      const auto& have = opt.tied_parameters();
      bool same        = want.size() == have.size();
      for (std::size_t i = 0; same && i < want.size(); ++i)
        same = want[i].param == have[i].param && want[i].peer == have[i].peer;
      detail::require<ConfigError>(same, "pmt::train::Trainer", [&] {
        return detail::str("the model has ", want.size(),
                           " parameters tied to another stage but the ZeRO-2 optimizer was given ", have.size(),
                           " (or others); construct it with the model's tied_parameters()");
      });
    } else {
      (void)model, (void)opt;
    }
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

  static const Mesh<Backend>& checked(const Mesh<Backend>& mesh, const Model& model, const TrainerOptions& options) {
    detail::require<ConfigError>(
        options.sync.compression == parallel::GradCompression::none || syncs_gradients, "pmt::train::Trainer", [&] {
          return detail::str(
              "gradient compression ", parallel::to_string(options.sync.compression),
              " needs synchronous data parallelism with a replicated optimizer; this trainer ",
              local ? "averages parameters (LocalSgd/DiLoCo)" : "has a ZeRO optimizer, which reduce-scatters itself");
        });
    detail::require<ConfigError>(
        options.precision == Precision::fp32 || std::is_same_v<typename Model::value_type, float>,
        "pmt::train::Trainer", [&] {
          return detail::str("precision bf16 rounds float products; this model's parameters are ",
                             sizeof(typename Model::value_type) * 8, "-bit. Use a float model or fp32");
        });
    detail::require<ConfigError>(
        !stale || mode::period != dynamic || options.staleness >= 0, "pmt::train::Trainer", [&] {
          return detail::str("BoundedStaleness<> takes its bound from TrainerOptions::staleness, which is ",
                             options.staleness, "; expected >= 0");
        });
    detail::require<ConfigError>(!local || mode::period != dynamic || options.period >= 1, "pmt::train::Trainer", [&] {
      return detail::str("LocalSgd<> and DiLoCo<> take their period from TrainerOptions::period, which is ",
                         options.period, "; expected >= 1");
    });
    detail::require<ConfigError>(
        !diloco || (options.outer.lr > 0 && options.outer.momentum >= 0 && options.outer.momentum < 1),
        "pmt::train::Trainer", [&] {
          return detail::str("DiLoCo's outer lr is ", options.outer.lr, " and momentum ", options.outer.momentum,
                             "; expected lr > 0 and 0 <= momentum < 1");
        });
    if constexpr (policy::chunks != dynamic)
      detail::require<ConfigError>(model.chunks() == policy::chunks, "pmt::train::Trainer", [&] {
        return detail::str("the policy's schedule is Interleaved<", policy::chunks, "> but the model holds ",
                           model.chunks(), " chunks per stage; build it with ", policy::chunks, " chunks");
      });
    else
      (void)model;
    check_activations(mesh, model);
    const auto s  = mesh.shape();
    const bool ok = (policy::dp || s.dp == 1) && (policy::tp || s.tp == 1) && (policy::pp || s.pp == 1) &&
                    (policy::stages == dynamic || !policy::pp || policy::stages == s.pp);
    detail::require<ConfigError>(ok, "pmt::train::Trainer", [&] {
      return detail::str("the mesh is dp(", s.dp, ") x tp(", s.tp, ") x pp(", s.pp, ") but the policy ",
                         policy::dp ? "has" : "has no", " DataParallel, ", policy::tp ? "has" : "has no",
                         " TensorSplit and ",
                         policy::pp ? (policy::stages == dynamic ? std::string("Pipeline<> (any pp)")
                                                                 : detail::str("Pipeline<", policy::stages, ">"))
                                    : std::string("no Pipeline"),
                         "; an axis without a policy must have degree 1");
    });
    return mesh;
  }

  const Mesh<Backend>& m_mesh;
  Model& m_model;
  Optimizer& m_opt;
  Exec m_exec;
  parallel::GradSync<T, Exec, Backend> m_sync;
  parallel::ScheduleKind m_schedule;
  std::optional<parallel::PipelineRunner<Model, Exec, Backend>> m_runner;
  OuterOptions m_outer;
  Precision m_precision;
  int m_period;                                          // LocalSgd/DiLoCo: steps between averages
  std::vector<Tensor<T, 1, Exec>> m_anchor, m_momentum;  // DiLoCo: the outer anchor and momentum
  bool m_anchored               = false;                 // the anchor holds the period's start (or was loaded)
  double m_last_norm            = 0;
  bool m_last_skipped           = false;
  std::int64_t m_calls          = 0;                             // step() calls
  std::uint64_t m_average_bytes = 0;                             // LocalSgd/DiLoCo: parameter bytes all-reduced over dp
  std::optional<parallel::StaleSync<T, Exec, Backend>> m_stale;  // BoundedStaleness
  bool m_applied = true;                                         // the last step applied an update
  // whether the first step / evaluation has agreed the measured choices (matmul paths) over the
  // world: every rank takes the same paths from then on (core/measured_choice.hpp)
  bool m_agreed_step = false, m_agreed_eval = false;
};

}  // namespace pmt::train
