// SPDX-License-Identifier: Apache-2.0
#pragma once
// The losses of pmt's models, each returning this rank's loss divided by the caller's global
// normaliser and writing the gradient of its input:
//
// vocab_parallel_cross_entropy (nn::Gpt's head): each tp rank holds the logits of its slice of
// the vocabulary, logits (N, V/tp) for vocabulary ids [v0, v0 + V/tp). Logits are never gathered:
//   1. row max over the shard, all_reduce(tp, max)
//   2. sum of exp(logit - max) over the shard and the target's logit (0 where another rank holds
//      it), one all_reduce(tp, sum) of both
//   3. loss = sum over rows with target != ignore_index of log(sum) + max - target_logit, divided
//      by `normaliser` (the global token count), summed in a fixed order
//   4. dlogits = (exp(logit - max) / sum - onehot) / normaliser on this rank's shard
// Communication: forward 2 all-reduces of N and 2N values. The loss is returned on the host
// (one fence); a target outside [0, V) that is not ignore_index raises.
//
// Loss layers for nn::StagedModel (and any code that wants a loss and its gradient in one call):
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

#include "pmt/comm/backend.hpp"
#include "pmt/core/error.hpp"
#include "pmt/core/tensor.hpp"
#include "pmt/core/workspace.hpp"
#include "pmt/ops/cross_entropy.hpp"
#include "pmt/ops/detail/rowwise.hpp"
#include "pmt/ops/reduction.hpp"
#include "pmt/parallel/regions.hpp"

#include <Kokkos_Core.hpp>

#include <cstdint>

namespace pmt::nn {

/// \brief Loss and dlogits of vocab-parallel cross-entropy (see the file comment).
/// \param logits (N, Vl) this rank's shard; \param targets (N) global ids; \param V the whole vocabulary.
/// \throws pmt::ShapeError for a target outside [0, V) other than ignore_index; pmt::ConfigError for normaliser <= 0.
template <class Backend, class Exec, class LV, class TV, class DV>
double vocab_parallel_cross_entropy(const comm::Communicator<Backend>& tp, const Exec& exec, const LV& logits,
                                    const TV& targets, std::int64_t v0, std::int64_t V, double normaliser,
                                    const DV& dlogits, std::int64_t ignore_index = -100) {
  using T = typename LV::non_const_value_type;
  static_check_view<Exec, LV>();
  static_check_view<Exec, TV>();
  static_check_view<Exec, DV>();
  constexpr const char* op = "pmt::nn::vocab_parallel_cross_entropy";
  const auto N             = static_cast<std::int64_t>(logits.extent(0));
  const auto Vl            = static_cast<std::int64_t>(logits.extent(1));
  pmt::detail::require(targets.extent(0) == logits.extent(0) && dlogits.extent(0) == logits.extent(0) &&
                           dlogits.extent(1) == logits.extent(1),
                       op, [&] {
                         return pmt::detail::str("logits is ", shape_str(logits), ", targets ", shape_str(targets),
                                                 ", dlogits ", shape_str(dlogits),
                                                 "; expected (N, V/tp), (N), (N, V/tp)");
                       });
  pmt::detail::require<ConfigError>(normaliser > 0, op, [&] {
    return pmt::detail::str("normaliser is ", normaliser, "; expected a positive token count");
  });
  pmt::detail::check_targets(exec, op, targets, V, ignore_index, logits);
  using Mem    = typename Exec::memory_space;
  auto row_max = workspace_view<Kokkos::View<T*, Kokkos::LayoutRight, Mem>>("pmt::nn::ce::max", N);
  auto stats =
      workspace_view<Kokkos::View<T**, Kokkos::LayoutRight, Mem>>("pmt::nn::ce::stats", N, 2);  // sum exp, target logit
  Kokkos::parallel_for(
      op, Kokkos::RangePolicy<Exec>(exec, 0, N),
      KOKKOS_LAMBDA(std::int64_t n) { row_max(n) = pmt::detail::lane_max(&logits(n, 0), Vl); });
  parallel::reduce_from(tp, exec, row_max, parallel::ReduceOp::Max);
  Kokkos::parallel_for(
      op, Kokkos::RangePolicy<Exec>(exec, 0, N), KOKKOS_LAMBDA(std::int64_t n) {
        const T mx   = row_max(n);
        stats(n, 0)  = pmt::detail::row_exp_sum(&logits(n, 0), Vl, mx);
        const auto t = static_cast<std::int64_t>(targets(n));
        stats(n, 1)  = (t >= v0 && t < v0 + Vl) ? logits(n, t - v0) : T(0);
      });
  parallel::reduce_from(tp, exec, stats);
  auto row_loss = workspace_view<Kokkos::View<double*, Kokkos::LayoutRight, Mem>>("pmt::nn::ce::row_loss", N);
  const T scale = static_cast<T>(1.0 / normaliser);
  Kokkos::parallel_for(
      op, Kokkos::RangePolicy<Exec>(exec, 0, N), KOKKOS_LAMBDA(std::int64_t n) {
        const auto t   = static_cast<std::int64_t>(targets(n));
        const bool use = t != ignore_index;
        const T mx = row_max(n), s = stats(n, 0);
        row_loss(n) = use ? static_cast<double>(pmt::detail::math::log(s) + mx - stats(n, 1)) : 0.0;
        const T inv = T(1) / s;
        for (std::int64_t j = 0; j < Vl; ++j) {
          const T p     = pmt::detail::exp_nonpositive(logits(n, j) - mx) * inv;
          dlogits(n, j) = use ? (p - (j + v0 == t ? T(1) : T(0))) * scale : T(0);
        }
      });
  auto loss = workspace_view<Kokkos::View<double, Kokkos::LayoutRight, Mem>>("pmt::nn::ce::loss");
  pmt::detail::chunked_reduce<pmt::detail::ReduceKind::Sum>(exec, row_loss, loss, 1.0 / normaliser, op);
  return pmt::detail::read_scalar(loss);
}

/// \brief Squared error summed over the row's outputs, divided by the normaliser.
/// \throws pmt::ShapeError when target and y differ in shape; pmt::ConfigError for normaliser <= 0.
template <class T, class Exec = Kokkos::DefaultExecutionSpace>
struct MseLoss {
  using target_type = Tensor<T, 2, Exec>;

  double operator()(const Exec& exec, const Tensor<T, 2, Exec>& y, const target_type& target, double normaliser,
                    const Tensor<T, 2, Exec>& dy) const {
    constexpr const char* op = "pmt::nn::MseLoss";
    pmt::detail::require(target.extent(0) == y.extent(0) && target.extent(1) == y.extent(1) &&
                             dy.extent(0) == y.extent(0) && dy.extent(1) == y.extent(1),
                         op, [&] {
                           return pmt::detail::str("y is ", shape_str(y), ", target ", shape_str(target), " and dy ",
                                                   shape_str(dy), "; expected three tensors of one shape (N, out)");
                         });
    pmt::detail::require<ConfigError>(normaliser > 0, op,
                                      [&] { return pmt::detail::str("normaliser is ", normaliser, "; expected > 0"); });
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
    pmt::detail::chunked_reduce<pmt::detail::ReduceKind::Sum>(exec, row, loss, 1.0 / normaliser, op);
    return pmt::detail::read_scalar(loss);
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
    return static_cast<double>(pmt::detail::read_scalar(loss));
  }
};

}  // namespace pmt::nn
