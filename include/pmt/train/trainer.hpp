// SPDX-License-Identifier: Apache-2.0
#pragma once
// Trainer: one training step of a model over a dp x tp Mesh (the non-pipelined case):
//   zero grads -> for each microbatch: forward + loss + backward (gradients accumulate; the dp
//   all-reduces of the last microbatch start during its backward) -> finish the dp sync ->
//   clip by the global norm -> optimizer step with the scheduled learning rate.
// step() returns the global loss: the sum over dp ranks and microbatches of the per-batch losses,
// each already divided by the global token count the caller passes.
// DpMode: Synchronous (gradients summed over dp every step) or LocalSgd<H> (no gradient
// communication; each replica normalises by its share of the tokens, normaliser / dp, and the
// parameters are averaged over dp every H steps; optimizer state stays local, so with plain SGD
// and H = 1 this is synchronous DP). ZeRO optimizers (shards_over_dp) reduce-scatter themselves.

#include "pmt/comm/collectives.hpp"
#include "pmt/comm/mesh.hpp"
#include "pmt/core/error.hpp"
#include "pmt/nn/module.hpp"
#include "pmt/optim/clip.hpp"
#include "pmt/optim/zero.hpp"
#include "pmt/parallel/grad_sync.hpp"
#include "pmt/policy/policies.hpp"

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <type_traits>
#include <vector>

namespace pmt::train {

/// \brief One microbatch of this dp rank: B sequences of T tokens and their targets.
template <class Ids>
struct Microbatch {
  Ids ids, targets;
  std::size_t B = 0, T = 0;
};

/// \brief Step options.
struct StepOptions {
  double normaliser = 1.0;  ///< the global number of target tokens of the step (all dp ranks, all microbatches)
  double lr         = 1e-3;
  double max_norm   = 1.0;  ///< clip the global gradient norm to this (<= 0: no clipping)
};

template <class Mode>
inline constexpr int local_sgd_period_v = 0;
template <int H>
inline constexpr int local_sgd_period_v<LocalSgd<H>> = H;

template <class Model, class Optimizer, class Exec, class Backend, class DpMode = Synchronous>
class Trainer {
  static constexpr int H = local_sgd_period_v<DpMode>;
  static_assert(std::is_same_v<DpMode, Synchronous> || H > 0,
                "pmt::train::Trainer: DpMode must be pmt::Synchronous or pmt::LocalSgd<H>");
  static_assert(!(H > 0 && Optimizer::shards_over_dp),
                "pmt::train::Trainer: local SGD keeps replicas apart between averages; a ZeRO optimizer "
                "needs synchronous gradients. Use one or the other");

 public:
  using T   = typename Model::value_type;
  using Ids = typename Model::Ids;

  Trainer(const Mesh<Backend>& mesh, Model& model, Optimizer& opt, const Exec& exec = Exec(),
          std::size_t bucket_bytes = parallel::GradSync<T, Exec, Backend>::default_bucket_bytes)
      : m_mesh(mesh), m_model(model), m_opt(opt), m_exec(exec), m_sync(mesh.comm(Axis::dp), model.parameters(), bucket_bytes) {
    m_model.on_block_grads([this](const std::vector<nn::Parameter<T, Exec>*>& ps) { m_sync.ready(m_exec, ps); });
  }
  Trainer(const Trainer&)            = delete;  // the model's hook points at this object
  Trainer& operator=(const Trainer&) = delete;

  /// \brief One step over this rank's microbatches; returns the global loss.
  /// \throws pmt::ConfigError for no microbatch or a non-positive normaliser.
  double step(const std::vector<Microbatch<Ids>>& microbatches, const StepOptions& o) {
    detail::require<ConfigError>(!microbatches.empty() && o.normaliser > 0, "pmt::train::Trainer::step", [&] {
      return detail::str(microbatches.size(), " microbatches and normaliser ", o.normaliser,
                         "; expected at least one microbatch and a positive token count");
    });
    m_opt.zero_grad();
    const int dp           = m_mesh.degree(Axis::dp);
    const double normaliser = H > 0 ? o.normaliser / dp : o.normaliser;
    double loss            = 0;
    for (std::size_t i = 0; i < microbatches.size(); ++i) {
      const auto& mb = microbatches[i];
      // ZeRO optimizers reduce-scatter the gradients themselves; local SGD does not sync them.
      m_sync.arm(!Optimizer::shards_over_dp && H == 0 && i + 1 == microbatches.size());
      loss += m_model.forward_backward(m_exec, mb.ids, mb.targets, mb.B, mb.T, normaliser);
    }
    m_sync.finish(m_exec);
    Kokkos::View<double, Kokkos::HostSpace> total("pmt::train::loss");
    total() = H > 0 ? loss / dp : loss;
    comm::all_reduce(m_mesh.comm(Axis::dp), Kokkos::DefaultHostExecutionSpace(), total);
    if constexpr (Optimizer::shards_over_dp) {
      m_last_norm = m_opt.step(m_exec, o.lr, o.max_norm);
    } else {
      m_last_norm = optim::clip_grad_norm(m_exec, m_model.parameters(), m_mesh.comm(Axis::tp), o.max_norm);
      m_opt.step(m_exec, o.lr);
    }
    if constexpr (H > 0) {
      if (++m_steps % H == 0 && dp > 1)
        for (auto* p : m_model.parameters()) comm::all_reduce(m_mesh.comm(Axis::dp), m_exec, p->value, comm::ReduceOp::Avg);
    }
    return total();
  }

  double last_grad_norm() const noexcept { return m_last_norm; }
  const parallel::GradSync<T, Exec, Backend>& grad_sync() const noexcept { return m_sync; }

 private:
  const Mesh<Backend>& m_mesh;
  Model& m_model;
  Optimizer& m_opt;
  Exec m_exec;
  parallel::GradSync<T, Exec, Backend> m_sync;
  double m_last_norm = 0;
  std::int64_t m_steps = 0;
};

}  // namespace pmt::train
