// SPDX-License-Identifier: Apache-2.0
#pragma once
// The strategies of pmt::Synchronous with a ZeRO optimizer, which shards over dp and moves the
// gradients itself:
//   Zero1Strategy  optim::ZeroAdamW: the optimizer state sharded; its step reduce-scatters the
//                  gradients, updates its shard and all-gathers the parameters.
//   Zero2Strategy  optim::Zero2AdamW: the gradients sharded too. The optimizer owns their storage:
//                  the model's hooks name each bucket before backward writes it (grads_needed)
//                  and when it is final (grads_ready, its reduce-scatter starts), so a bucket lives
//                  only while written; the tied and sequence-parallel sums run on its shards.
//   Zero3Strategy  optim::Zero3AdamW: the parameters sharded too. The model names the parameters
//                  whose values it reads (values_needed / values_done): the optimizer gathers
//                  them block by block, prefetching the next, and frees them after use; their
//                  gradients go as ZeRO-2's.
// None compresses gradients.

#include "pmt/core/error.hpp"
#include "pmt/optim/zero.hpp"
#include "pmt/optim/zero2.hpp"
#include "pmt/optim/zero3.hpp"
#include "pmt/parallel/stage_module.hpp"
#include "pmt/train/strategy.hpp"

#include <cmath>
#include <cstdint>

namespace pmt::train {

/// What the planner charges for Zero1Strategy and Zero2Strategy (plan::charge_of): gradients
/// reduce-scattered, the optimizer state (ZeRO-2: the gradients too) sharded over dp.
inline constexpr DpCharge zero1_charge{true, false, false, DpCharge::Gradients::reduce_scatter, false, false};
inline constexpr DpCharge zero2_charge{true, true, false, DpCharge::Gradients::reduce_scatter, false, false};
/// What the planner charges for Zero3Strategy: the parameters sharded too.
inline constexpr DpCharge zero3_charge{true, true, true, DpCharge::Gradients::reduce_scatter, false, false};

/// \brief ZeRO-1 (see the file comment).
template <class Model, class Optimizer, class Exec, class Backend>
class Zero1Strategy : public StrategyBase<Model, Optimizer, Exec, Backend> {
  using Base = StrategyBase<Model, Optimizer, Exec, Backend>;

 public:
  using typename Base::Context;
  static constexpr DpCharge charge = zero1_charge;

  explicit Zero1Strategy(const Context& c) : Base(c) {
    Base::require_uncompressed(c.options, "has a ZeRO optimizer, which reduce-scatters itself");
  }
  /// The optimizer's step: reduce-scatter, clip by the global norm, AdamW on the shard, all-gather.
  UpdateResult update(const StepOptions& o, std::int64_t /*step*/, bool bad_loss) {
    UpdateResult r;
    r.grad_norm = this->optimizer().step(this->exec(), o.lr, o.max_norm, o.skip_nonfinite, bad_loss);
    r.skipped   = bad_loss || (o.skip_nonfinite && !std::isfinite(r.grad_norm));
    return r;
  }

 protected:
  // ZeRO-2 and ZeRO-3 sum tied gradients on their shards, so they must know the model's tied
  // parameters.
  static void check_tied(Model& model, const Optimizer& opt, const char* which) {
    if constexpr (parallel::has_tied_parameters_v<Model>) {
      const auto want  = model.tied_parameters();
      const auto& have = opt.tied_parameters();
      bool same        = want.size() == have.size();
      for (std::size_t i = 0; same && i < want.size(); ++i)
        same = want[i].param == have[i].param && want[i].peer == have[i].peer;
      detail::require<ConfigError>(same, "pmt::train::Trainer", [&] {
        return detail::str("the model has ", want.size(), " parameters tied to another stage but the ", which,
                           " optimizer was given ", have.size(),
                           " (or others); construct it with the model's tied_parameters()");
      });
    } else {
      (void)model, (void)opt, (void)which;
    }
  }
};

/// \brief ZeRO-2 (see the file comment).
/// \throws pmt::ConfigError when the optimizer was not given the model's tied parameters.
template <class Model, class Optimizer, class Exec, class Backend>
class Zero2Strategy : public Zero1Strategy<Model, Optimizer, Exec, Backend> {
  using Base = Zero1Strategy<Model, Optimizer, Exec, Backend>;

 public:
  using typename Base::Context;
  using typename Base::Params;
  static constexpr DpCharge charge = zero2_charge;
  // a model that names gradients before writing them lets ZeRO-2 hold each bucket only then; one
  // that does not keeps them all from zero_grad() to the step
  static constexpr bool wants_grads_needed =
      parallel::has_needed_hook_v<Model, Exec> && parallel::has_grads_hook_v<Model, Exec>;

  explicit Zero2Strategy(const Context& c) : Base(c) {
    Base::check_tied(c.model, c.optimizer, "ZeRO-2");
    c.optimizer.announce_grads(wants_grads_needed);
  }
  void grads_needed(const Params& params) { this->optimizer().grads_needed(this->exec(), params); }
  void grads_ready(const Params& params) { this->optimizer().grads_ready(this->exec(), params); }
  /// The same sums as the base's, on the gradient shards.
  void finish_grads() { this->optimizer().finish_grads(this->exec()); }
  /// Evaluation: storage for the gradients; buckets dropped, not reduced.
  void begin_eval() {
    this->optimizer().zero_grad(this->exec());
    this->optimizer().collect_grads(false);
  }
  void end_eval() { this->optimizer().collect_grads(true); }
};

/// \brief ZeRO-3 (see the file comment).
/// \throws pmt::ConfigError when the optimizer was not given the model's tied parameters.
template <class Model, class Optimizer, class Exec, class Backend>
class Zero3Strategy : public Zero1Strategy<Model, Optimizer, Exec, Backend> {
  using Base = Zero1Strategy<Model, Optimizer, Exec, Backend>;
  static_assert(parallel::has_values_hooks_v<Model, Exec> && parallel::has_needed_hook_v<Model, Exec> &&
                    parallel::has_grads_hook_v<Model, Exec>,
                "pmt::train::Trainer: ZeRO-3 (optim::Zero3AdamW) needs a model that names the parameters it "
                "reads and writes: on_values_needed, on_values_done, on_grads_needed and on_grads_ready "
                "(parallel/stage_module.hpp); nn::Gpt and nn::StagedModel have them");

 public:
  using typename Base::Context;
  using typename Base::Params;
  static constexpr DpCharge charge         = zero3_charge;
  static constexpr bool wants_grads_needed = true;
  static constexpr bool wants_values       = true;
  static constexpr bool polls              = true;

  explicit Zero3Strategy(const Context& c) : Base(c) { Base::check_tied(c.model, c.optimizer, "ZeRO-3"); }
  void begin_step(std::int64_t /*step*/) { this->optimizer().begin_step(); }
  /// The gathers and reduce-scatters in flight move while the model computes.
  void poll() { this->optimizer().poll(); }
  void values_needed(const Params& params) { this->optimizer().values_needed(this->exec(), params); }
  void values_done(const Params& params) { this->optimizer().values_done(params); }
  void grads_needed(const Params& params) { this->optimizer().grads_needed(this->exec(), params); }
  void grads_ready(const Params& params) { this->optimizer().grads_ready(this->exec(), params); }
  /// The same sums as the base's, on the gradient shards.
  void finish_grads() { this->optimizer().finish_grads(this->exec()); }
  /// Evaluation: values gathered as named, nothing prefetched, dropped at the end.
  void begin_eval() { this->optimizer().begin_eval(); }
  void end_eval() { this->optimizer().end_eval(this->exec()); }
};

}  // namespace pmt::train
