// SPDX-License-Identifier: Apache-2.0
#pragma once
// Loss layers for nn::StagedModel (and any code that wants a loss and its gradient in one call).
// A loss layer has a target_type and
//   double operator()(const Exec&, const Tensor<T, 2, Exec>& y, const target_type& target,
//                     double normaliser, const Tensor<T, 2, Exec>& dy)
// which returns this rank's loss divided by `normaliser` and writes dL/dy into dy (y's shape).
// Pass the global number of samples (all dp ranks, all microbatches) as the normaliser: the
// ranks' and microbatches' losses and gradients then add up to the global mean (pmt sums over
// dp, never averages). y must be replicated over tp (the output of a Row or Replicate layer).
//   MseLoss           target (N, out) of T        loss = sum_nj (y - t)^2 / normaliser
//   CrossEntropyLoss  target (N) class ids        loss = sum_n -log softmax(y_n)[t_n] / normaliser
//                     (ids equal to ignore_index count nothing)
// Both sum in a fixed order (per-row work, then a chunked sum), so a run repeats bit for bit.

#include "pmt/core/error.hpp"
#include "pmt/core/tensor.hpp"
#include "pmt/core/workspace.hpp"
#include "pmt/ops/cross_entropy.hpp"
#include "pmt/ops/reduction.hpp"

#include <Kokkos_Core.hpp>

#include <cstdint>

namespace pmt::nn {

/// \brief Squared error summed over the row's outputs, divided by the normaliser.
/// \throws pmt::ShapeError when target and y differ in shape; pmt::ConfigError for normaliser <= 0.
template <class T, class Exec = Kokkos::DefaultExecutionSpace>
struct MseLoss {
  using target_type = Tensor<T, 2, Exec>;

  double operator()(const Exec& exec, const Tensor<T, 2, Exec>& y, const target_type& target, double normaliser,
                    const Tensor<T, 2, Exec>& dy) const {
    constexpr const char* op = "pmt::nn::MseLoss";
    detail::require(target.extent(0) == y.extent(0) && target.extent(1) == y.extent(1) && dy.extent(0) == y.extent(0) &&
                        dy.extent(1) == y.extent(1),
                    op, [&] {
                      return detail::str("y is ", shape_str(y), ", target ", shape_str(target), " and dy ",
                                         shape_str(dy), "; expected three tensors of one shape (N, out)");
                    });
    detail::require<ConfigError>(normaliser > 0, op,
                                 [&] { return detail::str("normaliser is ", normaliser, "; expected > 0"); });
    const auto cols = static_cast<std::int64_t>(y.extent(1));
    const T scale   = static_cast<T>(2.0 / normaliser);
    auto row        = workspace_view<Kokkos::View<double*, Kokkos::LayoutRight, typename Exec::memory_space>>(
        "pmt::nn::MseLoss::rows", y.extent(0));
    Kokkos::parallel_for(
        op, Kokkos::RangePolicy<Exec>(exec, 0, static_cast<std::int64_t>(y.extent(0))), KOKKOS_LAMBDA(std::int64_t n) {
          double acc = 0;
          for (std::int64_t j = 0; j < cols; ++j) {
            const T e = y(n, j) - target(n, j);
            dy(n, j)  = scale * e;
            acc += static_cast<double>(e) * static_cast<double>(e);
          }
          row(n) = acc;
        });
    auto loss = workspace_view<Kokkos::View<double, Kokkos::LayoutRight, typename Exec::memory_space>>(
        "pmt::nn::MseLoss::loss");
    detail::chunked_reduce<detail::ReduceKind::Sum>(exec, row, loss, 1.0 / normaliser, op);
    return detail::read_scalar(loss);
  }
};

/// \brief Softmax cross-entropy of replicated logits (N, classes) against class ids (N).
/// \throws pmt::ShapeError for mismatched shapes or an id outside [0, classes) other than
/// ignore_index; pmt::ConfigError for normaliser <= 0.
template <class T, class Exec = Kokkos::DefaultExecutionSpace>
struct CrossEntropyLoss {
  using target_type         = Kokkos::View<std::int32_t*, Kokkos::LayoutRight, typename Exec::memory_space>;
  std::int64_t ignore_index = -100;

  double operator()(const Exec& exec, const Tensor<T, 2, Exec>& y, const target_type& target, double normaliser,
                    const Tensor<T, 2, Exec>& dy) const {
    auto loss = workspace_view<Kokkos::View<T, Kokkos::LayoutRight, typename Exec::memory_space>>(
        "pmt::nn::CrossEntropyLoss::loss");
    ops::softmax_cross_entropy(exec, y, target, normaliser, loss, dy, static_cast<long>(ignore_index));
    return static_cast<double>(detail::read_scalar(loss));
  }
};

}  // namespace pmt::nn
