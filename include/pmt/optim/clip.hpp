// SPDX-License-Identifier: Apache-2.0
#pragma once
// Gradient clipping by the global norm: sqrt of the sum of squared gradients of the whole model,
// whatever its layout. Shards that differ across tp ranks are summed over tp; parameters
// replicated over tp are counted once; each pipeline stage adds its own parameters (summed over
// pp), and a stage's copy of another stage's parameter (the tied LM head) is left out. After
// data-parallel sync every dp replica holds the same gradients, so dp adds nothing.
// Deterministic: per-parameter squared norms in a fixed order.

#include "pmt/comm/collectives.hpp"
#include "pmt/comm/communicator.hpp"
#include "pmt/core/instrument.hpp"
#include "pmt/core/parameter.hpp"
#include "pmt/core/workspace.hpp"
#include "pmt/ops/multi_tensor.hpp"
#include "pmt/optim/optimizers.hpp"

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace pmt::optim {

/// \brief The global L2 norm of the gradients (see the file comment). Communication: one
/// all_reduce(tp) and, with `pp`, one all_reduce(pp) of one number (none on axes of size 1).
template <class T, class Exec, class Backend>
double global_grad_norm(const Exec& exec, const std::vector<Parameter<T, Exec>*>& params,
                        const comm::Communicator<Backend>& tp, const comm::Communicator<Backend>* pp = nullptr) {
  auto sums = workspace_view<Kokkos::View<double*, Kokkos::HostSpace>>("pmt::optim::grad_norm::sums",
                                                                       2);  // sharded, replicated
  sums(0) = sums(1) = 0;
  std::vector<Parameter<T, Exec>*> counted;  // without pp copies (counted on their own stage)
  for (auto* p : params)
    if (!p->pp_copy) counted.push_back(p);
  const std::vector<double> norms2 = ops::squared_norms(exec, grads_of(counted));  // one loop over all
  for (std::size_t i = 0; i < counted.size(); ++i) sums(counted[i]->tp_replicated ? 1 : 0) += norms2[i];
  if (tp.size() > 1) {
    Kokkos::View<double*, Kokkos::HostSpace> sharded(sums.data(), 1);
    comm::all_reduce_host_values(tp, exec, sharded);
  }
  sums(0) += sums(1);
  if (pp != nullptr && pp->size() > 1) {
    Kokkos::View<double*, Kokkos::HostSpace> stage(sums.data(), 1);
    comm::all_reduce_host_values(*pp, exec, stage);
  }
  return std::sqrt(sums(0));
}

/// \brief Scales all gradients by max_norm / norm when the global norm exceeds max_norm (a
/// max_norm <= 0 disables clipping). Returns the norm before clipping.
template <class T, class Exec, class Backend>
double clip_grad_norm(const Exec& exec, const std::vector<Parameter<T, Exec>*>& params,
                      const comm::Communicator<Backend>& tp, double max_norm,
                      const comm::Communicator<Backend>* pp = nullptr) {
  const Instrument instrument("pmt::optim::clip_grad_norm", Track::Optimizer, "clip");
  const double norm = global_grad_norm(exec, params, tp, pp);
  if (max_norm > 0 && norm > max_norm) {
    const T factor = static_cast<T>(max_norm / (norm + 1e-6));
    ops::scale_all(exec, grads_of(params), factor);
  }
  return norm;
}

/// \brief Linear warm-up over `warmup` steps to lr_max, then cosine decay to lr_min at `total`.
inline double warmup_cosine(std::int64_t step, std::int64_t warmup, std::int64_t total, double lr_max, double lr_min) {
  if (warmup > 0 && step < warmup) return lr_max * static_cast<double>(step + 1) / static_cast<double>(warmup);
  if (total <= warmup) return lr_max;
  const double progress = std::min(1.0, static_cast<double>(step - warmup) / static_cast<double>(total - warmup));
  return lr_min + 0.5 * (lr_max - lr_min) * (1.0 + std::cos(3.141592653589793 * progress));
}

}  // namespace pmt::optim
