// SPDX-License-Identifier: Apache-2.0
#pragma once
// Embedding lookup and its deterministic backward.
// Shapes: ids (N) integers; table, dtable (V, C); out, dout (N, C).
//   forward:  out(n, :) = table(ids(n), :)     (or += with accumulate, for token + position)
//   backward: dtable(v, :) += sum over n with ids(n) == v of dout(n, :), summed in increasing n
// The backward uses no floating-point atomics: rows are bucketed by id (integer counts), each
// bucket sorted, then each table row sums its bucket in order. Results do not depend on the
// thread count or scheduling. Both check the ids on the host first (one fence): an id outside
// [0, V) raises.

#include "pmt/core/error.hpp"
#include "pmt/core/tensor.hpp"
#include "pmt/core/workspace.hpp"

#include <Kokkos_Core.hpp>

#include <climits>  // for INT64_MIN
#include <cstdint>

namespace pmt::detail {

/// "No id is ignored": the default of the ignore_id parameters.
inline constexpr std::int64_t no_ignore_id = INT64_MIN;

template <class Exec, class IV>
void check_ids(const Exec& exec, const IV& ids, std::int64_t V, std::int64_t ignore, const char* op,
               const std::string& what) {
  std::int64_t bad = 0;
  Kokkos::parallel_reduce(
      "pmt::ops::embedding::check_ids", Kokkos::RangePolicy<Exec>(exec, 0, ids.extent(0)),
      KOKKOS_LAMBDA(std::int64_t n, std::int64_t & acc) {
        const auto id = static_cast<std::int64_t>(ids(n));
        if (id != ignore && (id < 0 || id >= V)) ++acc;
      },
      bad);
  require(bad == 0, op, [&] {
    return str(bad, " of ", ids.extent(0), " ids lie outside [0, ", V, ")",
               ignore != no_ignore_id ? str(" and are not the ignored id ", ignore) : std::string(), "; ", what);
  });
}

}  // namespace pmt::detail

namespace pmt::ops {

/// \brief Whether a lookup overwrites `out` or adds to it.
enum class Accumulate { No, Yes };

/// \brief out(n, :) = table(ids(n), :) (or += with Accumulate::Yes); rows whose id is
/// `ignore_id` get zeros (or nothing added): a vocabulary shard passes ids it does not hold so.
/// \throws pmt::ShapeError for mismatched shapes or an id outside [0, V) that is not ignore_id.
template <class Exec, class IV, class TV, class OV>
void embedding(const Exec& exec, const IV& ids, const TV& table, const OV& out, Accumulate acc = Accumulate::No,
               std::int64_t ignore_id = detail::no_ignore_id) {
  static_check_view<Exec, IV>();
  static_check_view<Exec, TV>();
  static_check_view<Exec, OV>();
  static_assert(IV::rank == 1 && TV::rank == 2 && OV::rank == 2,
                "pmt::ops::embedding: ids (N), table (V, C), out (N, C)");
  constexpr const char* op = "pmt::ops::embedding";
  detail::require(out.extent(0) == ids.extent(0) && out.extent(1) == table.extent(1), op, [&] {
    return detail::str("ids is ", shape_str(ids), ", table is ", shape_str(table), " but out is ", shape_str(out),
                       "; out must be (", ids.extent(0), ", ", table.extent(1), ")");
  });
  const auto V = static_cast<std::int64_t>(table.extent(0));
  detail::check_ids(exec, ids, V, ignore_id, op, "table is " + shape_str(table));
  const auto C     = static_cast<std::int64_t>(table.extent(1));
  const bool accum = acc == Accumulate::Yes;
  if (C == 0) return;  // rows of no features: nothing to copy (the ids were still checked)
  Kokkos::parallel_for(
      op, Kokkos::RangePolicy<Exec>(exec, 0, ids.extent(0)), KOKKOS_LAMBDA(std::int64_t n) {
        auto* dst = &out(n, 0);
        if (static_cast<std::int64_t>(ids(n)) == ignore_id) {
          if (!accum)
            for (std::int64_t c = 0; c < C; ++c) dst[c] = 0;
          return;
        }
        const auto* src = &table(static_cast<std::int64_t>(ids(n)), 0);
        if (accum) {
          for (std::int64_t c = 0; c < C; ++c) dst[c] += src[c];
        } else {
          for (std::int64_t c = 0; c < C; ++c) dst[c] = src[c];
        }
      });
}

/// \brief dtable(v, :) += sum of dout(n, :) over the n with ids(n) == v, in increasing n; rows
/// whose id is ignore_id contribute nothing.
/// \throws pmt::ShapeError for mismatched shapes or an id outside [0, V) that is not ignore_id.
template <class Exec, class IV, class DOV, class DTV>
void embedding_backward(const Exec& exec, const IV& ids, const DOV& dout, const DTV& dtable,
                        std::int64_t ignore_id = detail::no_ignore_id) {
  static_check_view<Exec, IV>();
  static_check_view<Exec, DOV>();
  static_check_view<Exec, DTV>();
  static_assert(IV::rank == 1 && DOV::rank == 2 && DTV::rank == 2,
                "pmt::ops::embedding_backward: ids (N), dout (N, C), dtable (V, C)");
  constexpr const char* op = "pmt::ops::embedding_backward";
  detail::require(dout.extent(0) == ids.extent(0) && dout.extent(1) == dtable.extent(1), op, [&] {
    return detail::str("ids is ", shape_str(ids), ", dtable is ", shape_str(dtable), " but dout is ", shape_str(dout),
                       "; dout must be (", ids.extent(0), ", ", dtable.extent(1), ")");
  });
  const auto N = static_cast<std::int64_t>(ids.extent(0));
  const auto V = static_cast<std::int64_t>(dtable.extent(0));
  const auto C = static_cast<std::int64_t>(dtable.extent(1));
  detail::check_ids(exec, ids, V, ignore_id, op, "dtable is " + shape_str(dtable));
  if (C == 0) return;  // nothing to accumulate (the ids were still checked)
  using Mem = typename Exec::memory_space;
  // Bucket rows by id: counts (integer atomics are exact), exclusive scan, scatter, sort buckets.
  auto start = workspace_view<Kokkos::View<std::int64_t*, Kokkos::LayoutRight, Mem>>(
      "pmt::ops::embedding_backward::start", static_cast<std::size_t>(V + 1));
  auto fill = workspace_view<Kokkos::View<std::int64_t*, Kokkos::LayoutRight, Mem>>(
      "pmt::ops::embedding_backward::fill", static_cast<std::size_t>(V));
  Kokkos::deep_copy(exec, start, std::int64_t(0));  // counts: from zero
  Kokkos::deep_copy(exec, fill, std::int64_t(0));
  auto rows = workspace_view<Kokkos::View<std::int64_t*, Kokkos::LayoutRight, Mem>>(
      "pmt::ops::embedding_backward::rows", static_cast<std::size_t>(N));
  Kokkos::parallel_for(
      op, Kokkos::RangePolicy<Exec>(exec, 0, N), KOKKOS_LAMBDA(std::int64_t n) {
        if (static_cast<std::int64_t>(ids(n)) != ignore_id)
          Kokkos::atomic_add(&start(static_cast<std::int64_t>(ids(n)) + 1), std::int64_t(1));
      });
  Kokkos::parallel_scan(
      op, Kokkos::RangePolicy<Exec>(exec, 0, V + 1), KOKKOS_LAMBDA(std::int64_t v, std::int64_t & partial, bool final) {
        partial += start(v);
        if (final) start(v) = partial;
      });
  Kokkos::parallel_for(
      op, Kokkos::RangePolicy<Exec>(exec, 0, N), KOKKOS_LAMBDA(std::int64_t n) {
        const auto id = static_cast<std::int64_t>(ids(n));
        if (id != ignore_id) rows(start(id) + Kokkos::atomic_fetch_add(&fill(id), std::int64_t(1))) = n;
      });
  Kokkos::parallel_for(
      op, Kokkos::RangePolicy<Exec>(exec, 0, V), KOKKOS_LAMBDA(std::int64_t v) {
        const std::int64_t lo = start(v), hi = start(v + 1);
        for (std::int64_t i = lo + 1; i < hi; ++i) {  // insertion sort: buckets are short
          const std::int64_t r = rows(i);
          std::int64_t j       = i - 1;
          for (; j >= lo && rows(j) > r; --j) rows(j + 1) = rows(j);
          rows(j + 1) = r;
        }
        auto* dst = &dtable(v, 0);
        for (std::int64_t i = lo; i < hi; ++i) {
          const auto* src = &dout(rows(i), 0);
          for (std::int64_t c = 0; c < C; ++c) dst[c] += src[c];
        }
      });
}

}  // namespace pmt::ops
