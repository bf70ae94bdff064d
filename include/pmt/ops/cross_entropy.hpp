// SPDX-License-Identifier: Apache-2.0
#pragma once
// Fused softmax + cross-entropy over integer targets, forward and backward in one pass.
// Shapes: logits, dlogits (N, V); targets (N) of an integer type; loss a rank-0 View.
//   loss     = sum over rows n with targets(n) != ignore_index of -log softmax(logits(n))[t_n],
//              divided by `normaliser` (the caller's token count: the global one under data or
//              pipeline parallelism, so that per-rank losses add up to the global mean)
//   dlogits  = dloss * (softmax(logits(n)) - onehot(t_n)) / normaliser, 0 on ignored rows
// dlogits may alias logits (in-place backward, llm.c style); pass an empty View to skip it.
// The target check reads the targets back to the host (one fence); a target outside [0, V) that
// is not ignore_index raises. Deterministic: per-row work, then a fixed-order sum of row losses.

#include "pmt/core/error.hpp"
#include "pmt/core/tensor.hpp"
#include "pmt/core/workspace.hpp"
#include "pmt/detail/kokkos_compat.hpp"
#include "pmt/ops/detail/rowwise.hpp"
#include "pmt/ops/reduction.hpp"

#include <Kokkos_Core.hpp>

#include <cstdint>

namespace pmt::detail {

/// Raises ShapeError naming `op`, the count, V, ignore_index and the logits' shape when a target
/// lies outside [0, V) and is not ignore_index. The count is read back on the host (one fence).
template <class Exec, class TV, class LV>
void check_targets(const Exec& exec, const char* op, const TV& targets, std::int64_t V, std::int64_t ignore_index,
                   const LV& logits) {
  const auto N     = static_cast<std::int64_t>(targets.extent(0));
  std::int64_t bad = 0;
  Kokkos::parallel_reduce(
      str(op, "::check_targets"), Kokkos::RangePolicy<Exec>(exec, 0, N),
      KOKKOS_LAMBDA(std::int64_t n, std::int64_t & acc) {
        const auto t = static_cast<std::int64_t>(targets(n));
        if (t != ignore_index && (t < 0 || t >= V)) ++acc;
      },
      bad);
  require(bad == 0, op, [&] {
    return str(bad, " of ", N, " targets lie outside [0, ", V, ") and are not ignore_index (", ignore_index,
               "); logits is ", shape_str(logits));
  });
}

}  // namespace pmt::detail

namespace pmt::ops {

/// \brief Fused softmax + cross-entropy (see the file comment for the formulas).
/// \throws pmt::ShapeError for mismatched shapes or a target outside [0, V) that is not
/// ignore_index; pmt::ConfigError for normaliser <= 0.
template <class Exec, class LV, class TV, class OV, class DV>
void softmax_cross_entropy(const Exec& exec, const LV& logits, const TV& targets, double normaliser, const OV& loss,
                           const DV& dlogits, long ignore_index = -100, double dloss = 1.0) {
  static_check_view<Exec, LV>();
  static_check_view<Exec, TV>();
  static_check_view<Exec, OV>();
  static_check_view<Exec, DV>();
  static_assert(LV::rank == 2 && TV::rank == 1 && OV::rank == 0 && DV::rank == 2,
                "pmt::ops::softmax_cross_entropy: logits (N, V), targets (N), loss (), dlogits (N, V)");
  static_assert(std::is_integral_v<typename TV::non_const_value_type>,
                "pmt::ops::softmax_cross_entropy: targets must hold integers");
  constexpr const char* op = "pmt::ops::softmax_cross_entropy";
  const auto N             = static_cast<std::int64_t>(logits.extent(0));
  const auto V             = static_cast<std::int64_t>(logits.extent(1));
  detail::require(targets.extent(0) == logits.extent(0), op, [&] {
    return detail::str("logits is ", shape_str(logits), " but targets is ", shape_str(targets), "; targets must be (",
                       N, ")");
  });
  const bool with_grad = dlogits.size() > 0;
  if (with_grad) detail::require_same_shape(op, "dlogits", dlogits, "logits", logits);
  detail::require<ConfigError>(normaliser > 0, op, [&] {
    return detail::str("normaliser is ", normaliser, "; expected a positive token count");
  });
  detail::check_targets(exec, op, targets, V, ignore_index, logits);
  using T       = typename LV::non_const_value_type;
  auto row_loss = workspace_view<Kokkos::View<double*, Kokkos::LayoutRight, typename Exec::memory_space>>(
      "pmt::ops::softmax_cross_entropy::row_loss", static_cast<std::size_t>(N));
  const T gscale = static_cast<T>(dloss / normaliser);
  if (detail::rowwise_use_teams<Exec>()) {  // devices: a row over a team thread's vector lanes
    detail::for_each_row_team(
        exec, op, N, KOKKOS_LAMBDA(const typename Kokkos::TeamPolicy<Exec>::member_type& m, std::int64_t n) {
          const long t = static_cast<long>(targets(n));
          const T* lr  = &logits(n, 0);
          T* dr        = with_grad ? &dlogits(n, 0) : nullptr;
          if (t == ignore_index) {
            Kokkos::single(Kokkos::PerThread(m), [&] { row_loss(n) = 0.0; });
            if (with_grad) Kokkos::parallel_for(Kokkos::ThreadVectorRange(m, V), [&](std::int64_t v) { dr[v] = T(0); });
            return;
          }
          const T mx = detail::vector_max(m, lr, V);
          const T s  = detail::vector_sum<T>(m, V, [&](std::int64_t v) { return detail::exp_nonpositive(lr[v] - mx); });
          const T lse          = mx + detail::math::log(s);
          const T target_logit = lr[t];  // read before dlogits (which may alias logits) is written
          Kokkos::single(Kokkos::PerThread(m), [&] { row_loss(n) = static_cast<double>(lse - target_logit); });
          if (with_grad)
            Kokkos::parallel_for(Kokkos::ThreadVectorRange(m, V), [&](std::int64_t v) {
              const T p = detail::exp_nonpositive(lr[v] - lse);
              dr[v]     = (p - (v == t ? T(1) : T(0))) * gscale;
            });
        });
    detail::chunked_reduce<detail::ReduceKind::Sum>(exec, row_loss, loss, 1.0 / normaliser, op);
    return;
  }
  Kokkos::parallel_for(
      op, Kokkos::RangePolicy<Exec>(exec, 0, N), KOKKOS_LAMBDA(std::int64_t n) {
        const long t = static_cast<long>(targets(n));
        if (t == ignore_index) {
          row_loss(n) = 0.0;
          if (with_grad)
            for (std::int64_t v = 0; v < V; ++v) dlogits(n, v) = T(0);
          return;
        }
        const T* lr = &logits(n, 0);  // V > 0 here: the target check passed
        const T mx  = detail::lane_max(lr, V);
        const T s   = detail::row_exp_sum(lr, V, mx);
        const T lse = mx + detail::math::log(s);
        row_loss(n) = static_cast<double>(lse - lr[t]);
        if (with_grad) {
          T* dr = &dlogits(n, 0);  // may alias lr: each element is read before it is written
          for (std::int64_t v = 0; v < V; ++v) {
            const T p = detail::exp_nonpositive(lr[v] - lse);
            dr[v]     = (p - (v == t ? T(1) : T(0))) * gscale;
          }
        }
      });
  detail::chunked_reduce<detail::ReduceKind::Sum>(exec, row_loss, loss, 1.0 / normaliser, op);
}

/// \brief Forward only: the loss, no gradient.
template <class Exec, class LV, class TV, class OV>
void cross_entropy(const Exec& exec, const LV& logits, const TV& targets, double normaliser, const OV& loss,
                   long ignore_index = -100) {
  Kokkos::View<typename LV::non_const_value_type**, Kokkos::LayoutRight, typename Exec::memory_space> none(
      "pmt::ops::cross_entropy::no_grad", 0, 0);
  softmax_cross_entropy(exec, logits, targets, normaliser, loss, none, ignore_index);
}

}  // namespace pmt::ops
