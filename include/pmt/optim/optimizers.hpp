// SPDX-License-Identifier: Apache-2.0
#pragma once
// Optimizers over a model's parameter list (each rank updates its own shards; state has the
// shards' shapes): SGD with momentum and AdamW. zero_grad(exec) clears the gradients before a
// step's first microbatch, on the instance the step runs on (on another instance it would not be
// ordered with the backward that accumulates into them). The learning rate is passed to step()
// so that a schedule can drive it.

#include "pmt/core/instrument.hpp"
#include "pmt/core/parameter.hpp"
#include "pmt/core/tensor.hpp"
#include "pmt/ops/multi_tensor.hpp"
#include "pmt/ops/update.hpp"

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <vector>

namespace pmt::optim {

/// \brief AdamW's constant hyper-parameters; the learning rate comes with each step() and the
/// optimizer counts the steps itself.
struct AdamWOptions {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  /// \brief The op-level parameters for learning rate `lr` at step `step`.
  ops::AdamWParams at(double lr, std::int64_t step) const { return {lr, beta1, beta2, eps, weight_decay, step}; }
};

/// \brief SGD's constant hyper-parameters; the learning rate comes with each step().
struct SgdOptions {
  double momentum = 0.9, weight_decay = 0.0;
  ops::SgdParams at(double lr) const { return {lr, momentum, weight_decay}; }
};

/// \brief The gradients (or values) of `params`, in order: the lists of the multi-tensor ops.
template <class T, class Exec>
std::vector<Tensor<T, 1, Exec>> tensors_of(const std::vector<Parameter<T, Exec>*>& params,
                                           Tensor<T, 1, Exec> Parameter<T, Exec>::*which) {
  std::vector<Tensor<T, 1, Exec>> out;
  out.reserve(params.size());
  for (auto* p : params) out.push_back(p->*which);
  return out;
}
template <class T, class Exec>
std::vector<Tensor<T, 1, Exec>> grads_of(const std::vector<Parameter<T, Exec>*>& params) {
  return tensors_of(params, &Parameter<T, Exec>::grad);
}
template <class T, class Exec>
std::vector<Tensor<T, 1, Exec>> values_of(const std::vector<Parameter<T, Exec>*>& params) {
  return tensors_of(params, &Parameter<T, Exec>::value);
}

/// \brief Sets every gradient to zero on `exec` (no fence).
template <class T, class Exec>
void zero_grad(const Exec& exec, const std::vector<Parameter<T, Exec>*>& params) {
  ops::zero_all(exec, grads_of(params));
}

/// \brief AdamW (Loshchilov & Hutter) over parameter shards; moments in T.
template <class T, class Exec>
class AdamW {
 public:
  using value_type                     = T;
  using execution_space                = Exec;
  static constexpr bool shards_over_dp = false;
  AdamW(std::vector<Parameter<T, Exec>*> params, AdamWOptions hyper) : m_params(std::move(params)), m_h(hyper) {
    for (auto* p : m_params) {
      m_m.emplace_back("pmt::optim::AdamW::m", p->size());
      m_v.emplace_back("pmt::optim::AdamW::v", p->size());
    }
  }
  /// \brief One update with learning rate `lr`; counts steps from 1 for bias correction.
  void step(const Exec& exec, double lr) {
    const Instrument instrument("pmt::optim::AdamW::step", Track::Optimizer, "adamw");
    ++m_step;
    ops::adamw_update_all(exec, values_of(m_params), grads_of(m_params), m_m, m_v, m_h.at(lr, m_step));
  }
  void zero_grad(const Exec& exec = Exec()) { optim::zero_grad(exec, m_params); }
  std::int64_t steps() const noexcept { return m_step; }
  /// \brief Sets the step count (bias correction continues from it; for checkpoints).
  void set_steps(std::int64_t n) noexcept { m_step = n; }
  const std::vector<Parameter<T, Exec>*>& parameters() const noexcept { return m_params; }
  /// \brief The first and second moments of parameter i (the shapes of its shard).
  const Tensor<T, 1, Exec>& exp_avg(std::size_t i) const { return m_m.at(i); }
  const Tensor<T, 1, Exec>& exp_avg_sq(std::size_t i) const { return m_v.at(i); }

 private:
  std::vector<Parameter<T, Exec>*> m_params;
  AdamWOptions m_h;
  std::vector<Tensor<T, 1, Exec>> m_m, m_v;
  std::int64_t m_step = 0;
};

/// \brief SGD with momentum and weight decay over parameter shards.
template <class T, class Exec>
class Sgd {
 public:
  static constexpr bool shards_over_dp = false;
  Sgd(std::vector<Parameter<T, Exec>*> params, SgdOptions hyper) : m_params(std::move(params)), m_h(hyper) {
    for (auto* p : m_params) m_vel.emplace_back("pmt::optim::Sgd::velocity", p->size());
  }
  void step(const Exec& exec, double lr) {
    ops::sgd_update_all(exec, values_of(m_params), grads_of(m_params), m_vel, m_h.at(lr));
  }
  void zero_grad(const Exec& exec = Exec()) { optim::zero_grad(exec, m_params); }
  const std::vector<Parameter<T, Exec>*>& parameters() const noexcept { return m_params; }
  /// \brief The momentum buffer of parameter i (checkpoints save and load it).
  const Tensor<T, 1, Exec>& velocity(std::size_t i) const { return m_vel.at(i); }

 private:
  std::vector<Parameter<T, Exec>*> m_params;
  SgdOptions m_h;
  std::vector<Tensor<T, 1, Exec>> m_vel;
};

}  // namespace pmt::optim
