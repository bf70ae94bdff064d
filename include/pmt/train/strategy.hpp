// SPDX-License-Identifier: Apache-2.0
#pragma once
// The data-parallel strategy concept. A data-parallel mode (the Mode of DataParallel<Mode>, or a
// bare mode given to the Trainer) names a strategy type; the Trainer calls the strategy's hooks
// at fixed points of every step and branches on nothing else:
//
//   Trainer::step                          strategy hook
//   -------------                          -------------
//   before the microbatches                begin_step(step)
//   the loss normaliser                    normaliser / share()   (share(): dp for replicas that
//                                                                  train apart, else 1)
//   before each microbatch                 arm(last microbatch)
//   at the model's progress points         poll()                 (only with polls)
//   before a layer reads its values        values_needed(params)  (only with wants_values)
//   after it                               values_done(params)
//   during backward, a bucket is named     grads_needed(params)   (only with wants_grads_needed)
//   during backward, a bucket is final     grads_ready(params)
//   after the microbatches                 finish_grads()         (gradients complete: the dp sum,
//                                                                  the tied and sequence-parallel
//                                                                  sums)
//   the update                             update(options, step, bad_loss) -> UpdateResult
//   after the update                       end_step(step)
//   Trainer::evaluate                      begin_eval(), arm(false), end_eval()
//   a checkpoint                           state()                (ParameterStates, saved beside
//                                                                  the optimizer's and restored)
//   metrics                                bytes_sent()
//   the planner                            charge                 (static: what it shards and what
//                                                                  it communicates)
//
// A strategy is built from a StrategyContext (the mesh, the model, the optimizer, the execution
// space instance and the TrainerOptions) and checks there what it cannot do. StrategyBase holds
// the context and gives every hook a default: replicas that communicate nothing over dp, the tied
// and sequence-parallel sums after backward, clip by the global norm and the optimizer's step.
// A strategy derives from it and replaces the hooks it needs.
//
// The built-in modes map to strategies in their own headers (strategy_of): Synchronous to
// train/dp_all_reduce.hpp (or, with a ZeRO-1/2/3 optimizer, train/dp_zero.hpp), LocalSgd<H> and
// DiLoCo<H> to train/dp_local.hpp, BoundedStaleness<S> to train/dp_stale.hpp. A user's mode is a
// type with a nested template `strategy<Model, Optimizer, Exec, Backend>` (docs/design.md shows
// one): it needs no pmt header changed.

#include "pmt/comm/mesh.hpp"
#include "pmt/core/error.hpp"
#include "pmt/core/parameter.hpp"
#include "pmt/core/step_context.hpp"
#include "pmt/core/tensor.hpp"
#include "pmt/optim/clip.hpp"
#include "pmt/parallel/grad_sync.hpp"
#include "pmt/parallel/stage_module.hpp"

#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

namespace pmt::train {

/// \brief Step options.
struct StepOptions {
  double normaliser = 1.0;  ///< the global number of target tokens of the step (all dp ranks, all microbatches)
  double lr         = 1e-3;
  double max_norm   = 1.0;  ///< clip the global gradient norm to this (<= 0: no clipping)
  /// Skip the optimizer update when the global loss or gradient norm is nan or inf (as
  /// mixed-precision trainers skip overflowed steps); last_step_skipped() tells. Both values are
  /// global, so every rank skips alike.
  bool skip_nonfinite = false;
  /// The global step number: keys layout-independent random draws (Dropout) through the step
  /// context. -1: the number of step() calls this Trainer made before (set it after a resume,
  /// so that the masks continue where the saved run stopped).
  std::int64_t step = -1;
};

/// \brief DiLoCo's outer optimizer: SGD with (Nesterov) momentum on the averaged parameter change
/// (the defaults are the DiLoCo paper's). \throws nothing; the strategy checks lr > 0,
/// 0 <= momentum < 1.
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
  /// ops::matmul_bf16 (operands rounded to bf16, fp32 sums) in the step context; parameters,
  /// gradients, optimizer state and the other ops stay in the model's type (fp32 masters).
  Precision precision = Precision::fp32;
  TrainerOptions()    = default;
  TrainerOptions(std::size_t bucket_bytes) : sync(bucket_bytes) {}
  TrainerOptions(parallel::GradSyncOptions s) : sync(s) {}
};

/// \brief What a strategy is built from: the Trainer's mesh, model, optimizer, execution space
/// instance and options (all outlive the strategy).
template <class Model, class Optimizer, class Exec, class Backend>
struct StrategyContext {
  const Mesh<Backend>& mesh;
  Model& model;
  Optimizer& optimizer;
  Exec exec;
  const TrainerOptions& options;
};

/// \brief What a strategy's update did: whether it applied one (BoundedStaleness applies none in
/// its first S steps), the global gradient norm, and whether it skipped a non-finite step.
struct UpdateResult {
  bool applied     = true;
  double grad_norm = 0;
  bool skipped     = false;
};

/// \brief What the planner charges for a strategy: what it shards over dp, how gradients cross
/// dp, and how often replicas meet.
struct DpCharge {
  enum class Gradients { none, all_reduce, reduce_scatter };
  bool shards_optimizer_state = false;
  bool shards_gradients       = false;
  bool shards_parameters      = false;
  Gradients gradients         = Gradients::none;  ///< every step
  bool averages_parameters    = false;            ///< replicas train apart and average every period
  bool delayed                = false;            ///< gradient sums applied some steps late
};

/// \brief The defaults of every hook (see the file comment): replicas that communicate nothing
/// over dp. Strategies derive from it and replace what they do differently.
template <class Model, class Optimizer, class Exec, class Backend>
class StrategyBase {
 public:
  using T       = typename Model::value_type;
  using Params  = std::vector<Parameter<T, Exec>*>;
  using Context = StrategyContext<Model, Optimizer, Exec, Backend>;
  static constexpr DpCharge charge{};
  /// Whether the model should announce gradients before writing them (grads_needed).
  static constexpr bool wants_grads_needed = false;
  /// Whether the model should name the parameters whose values it reads (values_needed /
  /// values_done: ZeRO-3 gathers them there).
  static constexpr bool wants_values = false;
  /// Whether the strategy polls communication at the model's progress points during the
  /// microbatches (poll(): ZeRO-3's gathers in flight).
  static constexpr bool polls = false;

  explicit StrategyBase(const Context& c) : m_mesh(c.mesh), m_model(c.model), m_opt(c.optimizer), m_exec(c.exec) {}

  void begin_step(std::int64_t /*step*/) {}
  /// The loss normaliser's divisor: replicas that train apart normalise by their share.
  double share() const noexcept { return 1; }
  void arm(bool /*last_microbatch*/) {}
  void poll() {}
  void values_needed(const Params& /*params*/) {}
  void values_done(const Params& /*params*/) {}
  void grads_needed(const Params& /*params*/) {}
  void grads_ready(const Params& /*params*/) {}
  /// Tied copies on two stages sum their gradients; sequence parallelism sums the rows' parts.
  void finish_grads() {
    parallel::finalize_grads(m_exec, m_mesh.comm(Axis::pp), m_model);
    parallel::sum_partial_grads(m_exec, m_mesh.comm(Axis::tp), m_model.parameters());
  }
  /// Clip by the global norm (over tp and pp), then the optimizer's step unless skipped.
  UpdateResult update(const StepOptions& o, std::int64_t /*step*/, bool bad_loss) {
    UpdateResult r;
    r.grad_norm =
        optim::clip_grad_norm(m_exec, m_model.parameters(), m_mesh.comm(Axis::tp), o.max_norm, &m_mesh.comm(Axis::pp));
    r.skipped = bad_loss || (o.skip_nonfinite && !std::isfinite(r.grad_norm));
    if (!r.skipped) m_opt.step(m_exec, o.lr);
    return r;
  }
  void end_step(std::int64_t /*step*/) {}
  void begin_eval() {}
  void end_eval() {}
  ParameterStates<T, Exec> state() { return {}; }
  std::uint64_t bytes_sent() const noexcept { return 0; }

 protected:
  const Mesh<Backend>& mesh() const noexcept { return m_mesh; }
  Model& model() const noexcept { return m_model; }
  Optimizer& optimizer() const noexcept { return m_opt; }
  const Exec& exec() const noexcept { return m_exec; }
  /// \throws pmt::ConfigError when the options compress gradients: `why` says what this
  /// strategy does instead of a synchronous all-reduce.
  static void require_uncompressed(const TrainerOptions& options, const char* why) {
    detail::require<ConfigError>(
        options.sync.compression == parallel::GradCompression::none, "pmt::train::Trainer", [&] {
          return detail::str("gradient compression ", parallel::to_string(options.sync.compression),
                             " needs synchronous data parallelism with a replicated "
                             "optimizer; this trainer ",
                             why);
        });
  }

 private:
  const Mesh<Backend>& m_mesh;
  Model& m_model;
  Optimizer& m_opt;
  Exec m_exec;
};

/// \brief The strategy of data-parallel mode Mode for a Trainer of Model, Optimizer, Exec and
/// Backend: Mode's nested template `strategy<Model, Optimizer, Exec, Backend>`, or a
/// specialization a built-in mode's header gives.
template <class Mode, class Model, class Optimizer, class Exec, class Backend, class = void>
struct strategy_of {
  static_assert(pmt::detail::dependent_false_v<Mode>,
                "pmt::train::Trainer: this DpMode is not a data-parallel mode: it names no strategy. Use "
                "pmt::Synchronous, pmt::LocalSgd<H>, pmt::DiLoCo<H> or pmt::BoundedStaleness<S>, or give the mode "
                "a nested template strategy<Model, Optimizer, Exec, Backend> (train/strategy.hpp)");
};
/// \brief A mode with a nested strategy template (a user's).
template <class Mode, class Model, class Optimizer, class Exec, class Backend>
struct strategy_of<Mode, Model, Optimizer, Exec, Backend,
                   std::void_t<typename Mode::template strategy<Model, Optimizer, Exec, Backend>>> {
  using type = typename Mode::template strategy<Model, Optimizer, Exec, Backend>;
};
/// \brief strategy_of's type.
template <class Mode, class Model, class Optimizer, class Exec, class Backend>
using strategy_of_t = typename strategy_of<Mode, Model, Optimizer, Exec, Backend>::type;

}  // namespace pmt::train
