// SPDX-License-Identifier: Apache-2.0
#pragma once
// Row-wise argmax and classification accuracy of replicated logits (N, C).
//   argmax_rows(exec, x, ids)             ids(n) = the first j with x(n, j) = max_j x(n, j)
//   accuracy(exec, logits, targets)       {rows whose argmax equals the target, rows counted}
//                                         (targets equal to ignore_index are not counted)
// A nan in a row makes that row's argmax the nan's index (it compares as the largest), so a
// broken model never looks accurate. Counts come back to the host (one fence).

#include "pmt/core/error.hpp"
#include "pmt/core/tensor.hpp"
#include "pmt/core/workspace.hpp"

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <utility>

namespace pmt::ops {

/// \brief ids(n) = argmax_j x(n, j), the first index of the largest value.
/// \throws pmt::ShapeError when ids is not (N) or x has no column.
template <class Exec, class XV, class IV>
void argmax_rows(const Exec& exec, const XV& x, const IV& ids) {
  static_check_view<Exec, XV>();
  static_check_view<Exec, IV>();
  static_assert(XV::rank == 2 && IV::rank == 1, "pmt::ops::argmax_rows: x (N, C) and ids (N)");
  detail::require(ids.extent(0) == x.extent(0) && x.extent(1) > 0, "pmt::ops::argmax_rows", [&] {
    return detail::str("x is ", shape_str(x), " and ids ", shape_str(ids), "; expected (N, C > 0) and (N)");
  });
  using I         = typename IV::non_const_value_type;
  const auto cols = static_cast<std::int64_t>(x.extent(1));
  Kokkos::parallel_for(
      "pmt::ops::argmax_rows", Kokkos::RangePolicy<Exec>(exec, 0, static_cast<std::int64_t>(x.extent(0))),
      KOKKOS_LAMBDA(std::int64_t n) {
        std::int64_t best = 0;
        for (std::int64_t j = 1; j < cols; ++j) {
          const auto v = x(n, j), b = x(n, best);
          if (v > b || (v != v && b == b)) best = j;  // a nan wins
        }
        ids(n) = static_cast<I>(best);
      });
}

/// \brief {correct, counted}: rows whose argmax equals their target, and rows whose target is
/// not ignore_index. \throws pmt::ShapeError when targets is not (N).
template <class Exec, class XV, class TV>
std::pair<std::int64_t, std::int64_t> accuracy(const Exec& exec, const XV& logits, const TV& targets,
                                               std::int64_t ignore_index = -100) {
  static_check_view<Exec, XV>();
  static_check_view<Exec, TV>();
  detail::require(targets.extent(0) == logits.extent(0) && logits.extent(1) > 0, "pmt::ops::accuracy", [&] {
    return detail::str("logits is ", shape_str(logits), " and targets ", shape_str(targets),
                       "; expected (N, C > 0) and (N)");
  });
  auto ids = workspace_view<Kokkos::View<std::int64_t*, Kokkos::LayoutRight, typename Exec::memory_space>>(
      "pmt::ops::accuracy::ids", logits.extent(0));
  argmax_rows(exec, logits, ids);
  std::int64_t correct = 0, counted = 0;
  const auto N = static_cast<std::int64_t>(logits.extent(0));
  Kokkos::parallel_reduce(
      "pmt::ops::accuracy::counted", Kokkos::RangePolicy<Exec>(exec, 0, N),
      KOKKOS_LAMBDA(std::int64_t n, std::int64_t & k) { k += static_cast<std::int64_t>(targets(n)) != ignore_index; },
      counted);
  Kokkos::parallel_reduce(
      "pmt::ops::accuracy::correct", Kokkos::RangePolicy<Exec>(exec, 0, N),
      KOKKOS_LAMBDA(std::int64_t n, std::int64_t & c) {
        const auto t = static_cast<std::int64_t>(targets(n));
        c += t != ignore_index && ids(n) == t;
      },
      correct);
  return {correct, counted};
}

}  // namespace pmt::ops
