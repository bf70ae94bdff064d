// SPDX-License-Identifier: Apache-2.0
#pragma once
// AllReduceStrategy, the strategy of pmt::Synchronous with a replicated optimizer: the gradients
// summed over dp every step, in buckets (parallel/grad_sync.hpp) whose all-reduces start during
// the last microbatch's backward as soon as a bucket is final, optionally sent as bf16 with error
// feedback (TrainerOptions::sync; the compression wraps the bucket transport). Checkpoints keep
// each rank's error-feedback residuals ("grad_residual", a per-rank state: a pipeline copy of a
// tied parameter keeps its own). Equal to one rank on the global batch.

#include "pmt/comm/mesh.hpp"
#include "pmt/parallel/grad_sync.hpp"
#include "pmt/train/strategy.hpp"

#include <cstdint>

namespace pmt::train {

/// What the planner charges for AllReduceStrategy (plan::charge_of): gradients all-reduced every step.
inline constexpr DpCharge all_reduce_charge{false, false, false, DpCharge::Gradients::all_reduce, false, false};

/// \brief Synchronous data parallelism by bucketed all-reduce (see the file comment).
template <class Model, class Optimizer, class Exec, class Backend>
class AllReduceStrategy : public StrategyBase<Model, Optimizer, Exec, Backend> {
  using Base = StrategyBase<Model, Optimizer, Exec, Backend>;

 public:
  using typename Base::Context;
  using typename Base::Params;
  using typename Base::T;
  static constexpr DpCharge charge = all_reduce_charge;

  explicit AllReduceStrategy(const Context& c)
      : Base(c), m_sync(c.mesh.comm(Axis::dp), c.model.parameters(), c.options.sync) {}

  void arm(bool last_microbatch) { m_sync.arm(last_microbatch); }
  void grads_ready(const Params& params) { m_sync.ready(this->exec(), params); }
  void finish_grads() {
    m_sync.finish(this->exec());
    Base::finish_grads();
  }
  /// The error-feedback residual of each parameter (compressed gradients on dp > 1 only).
  ParameterStates<T, Exec> state() {
    ParameterStates<T, Exec> st;
    if (m_sync.compression() != parallel::GradCompression::none && this->mesh().degree(Axis::dp) > 1) {
      typename ParameterStates<T, Exec>::State r{"grad_residual", {}, /*defaults_to_value=*/false, /*per_rank=*/true};
      for (auto* p : this->model().parameters()) r.of.push_back(m_sync.residual(p));
      st.states.push_back(std::move(r));
    }
    return st;
  }
  std::uint64_t bytes_sent() const noexcept { return m_sync.bytes_sent(); }
  /// \brief The buckets (their count, how many started during backward, the bytes sent).
  const parallel::GradSync<T, Exec, Backend>& grad_sync() const noexcept { return m_sync; }

 private:
  parallel::GradSync<T, Exec, Backend> m_sync;
};

}  // namespace pmt::train
