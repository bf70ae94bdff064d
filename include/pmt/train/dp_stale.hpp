// SPDX-License-Identifier: Apache-2.0
#pragma once
// StaleStrategy, the strategy of pmt::BoundedStaleness<S>: each step starts the dp sum of its
// gradients without waiting and applies the sum started S steps before (parallel/stale_sync.hpp);
// no update in the first S steps. The model's gradients-ready hook moves the sums in flight on
// during backward. Checkpoints keep the S sums not yet applied, "stale_grad_0" ... (completing
// those in flight: collective over dp; resume with StepOptions::step). BoundedStaleness<> takes S
// at run time (TrainerOptions::staleness). Goes with neither a ZeRO optimizer nor compression.

#include "pmt/core/error.hpp"
#include "pmt/parallel/stale_sync.hpp"
#include "pmt/policy/policies.hpp"
#include "pmt/train/strategy.hpp"

#include <cstdint>

namespace pmt::train {

/// What the planner charges for StaleStrategy (plan::charge_of): gradient sums all-reduced every
/// step and applied some steps late.
inline constexpr DpCharge stale_charge{false, false, false, DpCharge::Gradients::all_reduce, false, true};

/// \brief Bounded staleness S (pmt::dynamic: TrainerOptions::staleness).
template <class Model, class Optimizer, class Exec, class Backend, int S>
class StaleStrategy : public StrategyBase<Model, Optimizer, Exec, Backend> {
  using Base = StrategyBase<Model, Optimizer, Exec, Backend>;
  static_assert(!Optimizer::shards_over_dp,
                "pmt::train::Trainer: bounded staleness applies whole gradient sums late; a ZeRO "
                "optimizer reduce-scatters them itself. Use one or the other");

 public:
  using typename Base::Context;
  using typename Base::Params;
  using typename Base::T;
  static constexpr DpCharge charge = stale_charge;

  explicit StaleStrategy(const Context& c)
      : Base(c), m_stale(c.mesh.comm(Axis::dp), c.model.parameters(), checked_bound(c.options)) {
    Base::require_uncompressed(c.options, "applies gradient sums late (BoundedStaleness)");
  }
  /// The sums in flight move on during backward.
  void grads_ready(const Params& /*params*/) { m_stale.progress(); }
  /// This step's sum starts; the one of S steps before arrives and is applied (none in the
  /// first S steps: nothing applied, norm 0).
  UpdateResult update(const StepOptions& o, std::int64_t step, bool bad_loss) {
    if (!m_stale.exchange(this->exec(), step)) return UpdateResult{false, 0, false};
    return Base::update(o, step, bad_loss);
  }
  ParameterStates<T, Exec> state() {
    ParameterStates<T, Exec> st;
    for (auto& x : m_stale.states()) st.states.push_back(std::move(x));
    st.loaded = m_stale.loaded_flag();
    return st;
  }
  std::uint64_t bytes_sent() const noexcept { return m_stale.bytes_sent(); }
  /// \brief The gradient-sum machinery (its bound, the last applied sum's age).
  const parallel::StaleSync<T, Exec, Backend>* stale_sync() const noexcept { return &m_stale; }

 private:
  static int checked_bound(const TrainerOptions& options) {
    const int bound = S == dynamic ? options.staleness : S;
    detail::require<ConfigError>(bound >= 0, "pmt::train::Trainer", [&] {
      return detail::str("BoundedStaleness<> takes its bound from TrainerOptions::staleness, which is ",
                         options.staleness, "; expected >= 0");
    });
    return bound;
  }
  parallel::StaleSync<T, Exec, Backend> m_stale;
};

/// \brief BoundedStaleness<S>'s strategy.
template <int S, class Model, class Optimizer, class Exec, class Backend>
struct strategy_of<BoundedStaleness<S>, Model, Optimizer, Exec, Backend> {
  using type = StaleStrategy<Model, Optimizer, Exec, Backend, S>;
};

}  // namespace pmt::train
