// SPDX-License-Identifier: Apache-2.0
#pragma once
// The strategies of replicas that train apart and meet every H steps:
//   LocalSgdStrategy  pmt::LocalSgd<H>: no gradient communication; each replica normalises by
//                     its share of the tokens (normaliser / dp), and the parameters are averaged
//                     over dp every H steps. Optimizer state stays local, so with plain SGD and
//                     H = 1 this is synchronous DP.
//   DiLoCoStrategy    pmt::DiLoCo<H>: as LocalSgd<H>, but every H steps an outer step: with the
//                     anchor A (the parameters all replicas started the period from) and the dp
//                     average x of the replicas' parameters, delta = A - x, m = mu m + delta,
//                     A -= lr (delta + mu m) (Nesterov; A -= lr m without), and every replica
//                     continues from A; the inner optimizer's state stays local. Checkpoints keep
//                     "outer_anchor" (loaded as the parameters when a checkpoint lacks it) and
//                     "outer_momentum".
// A period ends after global steps H - 1, 2H - 1, ... (StepOptions::step; by default the number
// of step() calls), so a resumed run keeps the phase. LocalSgd<> and DiLoCo<> take H at run time
// (TrainerOptions::period). Neither goes with a ZeRO optimizer or compressed gradients.

#include "pmt/comm/collectives.hpp"
#include "pmt/core/error.hpp"
#include "pmt/core/tensor.hpp"
#include "pmt/policy/policies.hpp"
#include "pmt/train/strategy.hpp"

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <vector>

namespace pmt::detail {

/// DiLoCo's outer step on one parameter: delta = a - x, m = mu m + delta, a -= lr (delta + mu m)
/// (Nesterov) or lr m, x = a. A free function: CUDA's extended lambdas may not sit in a private
/// member.
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

/// What the planner charges for LocalSgdStrategy (plan::charge_of): no gradient traffic; the
/// replicas' parameters averaged every period.
inline constexpr DpCharge averaging_charge{false, false, false, DpCharge::Gradients::none, true, false};

/// \brief Local SGD with a period of H steps (pmt::dynamic: TrainerOptions::period).
template <class Model, class Optimizer, class Exec, class Backend, int H>
class LocalSgdStrategy : public StrategyBase<Model, Optimizer, Exec, Backend> {
  using Base = StrategyBase<Model, Optimizer, Exec, Backend>;
  static_assert(!Optimizer::shards_over_dp,
                "pmt::train::Trainer: local SGD and DiLoCo keep replicas apart between averages; a ZeRO "
                "optimizer needs synchronous gradients. Use one or the other");

 public:
  using typename Base::Context;
  static constexpr DpCharge charge = averaging_charge;

  explicit LocalSgdStrategy(const Context& c) : Base(c), m_period(H == dynamic ? c.options.period : H) {
    Base::require_uncompressed(c.options, "averages parameters (LocalSgd/DiLoCo)");
    detail::require<ConfigError>(H != dynamic || m_period >= 1, "pmt::train::Trainer", [&] {
      return detail::str("LocalSgd<> and DiLoCo<> take their period from TrainerOptions::period, which is ", m_period,
                         "; expected >= 1");
    });
  }
  /// Each replica's loss is its share of the tokens: normaliser / dp.
  double share() const noexcept { return this->mesh().degree(Axis::dp); }
  /// The parameters averaged over dp at the end of each period.
  void end_step(std::int64_t step) {
    if ((step + 1) % m_period != 0) return;
    if (this->mesh().degree(Axis::dp) > 1)
      for (auto* p : this->model().parameters()) {
        comm::all_reduce(this->mesh().comm(Axis::dp), this->exec(), p->value, comm::ReduceOp::Avg);
        m_average_bytes += p->bytes();
      }
  }
  std::uint64_t bytes_sent() const noexcept { return m_average_bytes; }
  /// \brief The averaging period.
  int period() const noexcept { return m_period; }

 private:
  int m_period;
  std::uint64_t m_average_bytes = 0;  // parameter bytes all-reduced over dp
};

/// \brief DiLoCo with a period of H steps (see the file comment).
template <class Model, class Optimizer, class Exec, class Backend, int H>
class DiLoCoStrategy : public LocalSgdStrategy<Model, Optimizer, Exec, Backend, H> {
  using Base = LocalSgdStrategy<Model, Optimizer, Exec, Backend, H>;

 public:
  using typename Base::Context;
  using typename Base::T;

  explicit DiLoCoStrategy(const Context& c) : Base(c), m_outer(c.options.outer) {
    detail::require<ConfigError>(m_outer.lr > 0 && m_outer.momentum >= 0 && m_outer.momentum < 1, "pmt::train::Trainer",
                                 [&] {
                                   return detail::str("DiLoCo's outer lr is ", m_outer.lr, " and momentum ",
                                                      m_outer.momentum, "; expected lr > 0 and 0 <= momentum < 1");
                                 });
    for (auto* p : c.model.parameters()) {
      m_anchor.emplace_back("pmt::train::Trainer::outer_anchor", p->size());
      m_momentum.emplace_back("pmt::train::Trainer::outer_momentum", p->size());
    }
  }
  /// The period starts from the parameters as they are now (or as loaded).
  void begin_step(std::int64_t /*step*/) {
    if (m_anchored) return;
    const auto ps = this->model().parameters();
    for (std::size_t i = 0; i < ps.size(); ++i) Kokkos::deep_copy(this->exec(), m_anchor[i], ps[i]->value);
    m_anchored = true;
  }
  /// The average, then the outer step on it; every replica continues from the new anchor.
  void end_step(std::int64_t step) {
    Base::end_step(step);
    if ((step + 1) % this->period() != 0) return;
    const auto ps = this->model().parameters();
    const T lr = static_cast<T>(m_outer.lr), mu = static_cast<T>(m_outer.momentum);
    for (std::size_t i = 0; i < ps.size(); ++i)
      detail::outer_update(this->exec(), ps[i]->value, m_anchor[i], m_momentum[i], lr, mu, m_outer.nesterov);
  }
  ParameterStates<T, Exec> state() {
    ParameterStates<T, Exec> st;
    st.states.push_back({"outer_anchor", m_anchor, true});
    st.states.push_back({"outer_momentum", m_momentum, false});
    st.loaded = &m_anchored;
    return st;
  }
  const OuterOptions& outer_options() const noexcept { return m_outer; }

 private:
  OuterOptions m_outer;
  std::vector<Tensor<T, 1, Exec>> m_anchor, m_momentum;  // the outer anchor and momentum
  bool m_anchored = false;                               // the anchor holds the period's start (or was loaded)
};

/// \brief LocalSgd<H>'s strategy.
template <int H, class Model, class Optimizer, class Exec, class Backend>
struct strategy_of<LocalSgd<H>, Model, Optimizer, Exec, Backend> {
  using type = LocalSgdStrategy<Model, Optimizer, Exec, Backend, H>;
};
/// \brief DiLoCo<H>'s strategy.
template <int H, class Model, class Optimizer, class Exec, class Backend>
struct strategy_of<DiLoCo<H>, Model, Optimizer, Exec, Backend> {
  using type = DiLoCoStrategy<Model, Optimizer, Exec, Backend, H>;
};

}  // namespace pmt::train
