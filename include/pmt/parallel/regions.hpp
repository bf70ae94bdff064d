// SPDX-License-Identifier: Apache-2.0
#pragma once
// Conjugate communication regions (Megatron's mappings): the one route from the layers (nn/)
// to the communicators. Each region is a pair, a forward and its conjugate backward, over the
// communicator of one mesh axis (tp for the tensor-parallel layers):
//   copy_to       forward: identity (x enters a region where every rank uses it whole)
//                 backward: copy_to_backward = the sum of the ranks' gradients (all-reduce)
//   reduce_from   forward: the sum of the ranks' partial results (all-reduce), in place
//                 backward: identity
//   scatter_to    forward: this rank's block of columns, (N, C) -> (N, C / p)
//                 backward: gather_from
//   gather_from   forward: every rank's columns side by side, (N, c) -> (N, c p), rank order
//                 backward: scatter_to
// A Col layer's input is a copy_to (its dx is summed over tp), a Row layer's output a
// reduce_from; vocab-parallel cross-entropy reduces its statistics with reduce_from (max, then
// sum).
// Sequence parallelism (rows, the B T tokens, split over the axis in contiguous blocks; rank r
// holds rows [r N/p, (r+1) N/p)):
//   gather_rows          forward: every rank's rows stacked, (N/p, C) -> (N, C) (all-gather)
//                        backward: reduce_scatter_rows (the ranks' partial dx summed, each keeps its rows)
//   reduce_scatter_rows  forward: the ranks' partial results summed, each keeps its rows,
//                        (N, C) -> (N/p, C) (reduce-scatter); backward: gather_rows
//   split_rows           forward: this rank's rows, (N, C) -> (N/p, C), no communication
//                        backward: gather_rows
// A sequence-parallel Col layer's input is a gather_rows (in place of copy_to), a Row layer's
// output a reduce_scatter_rows (in place of reduce_from): the same bytes on the wire as the
// all-reduce they replace, and the layers between them (norms, residuals) hold N/p rows. Layers include this header and
// the Mesh, never <mpi.h> or <nccl.h> nor the collectives; nor does this header include a backend:
// a program that runs a layer over MPI or NCCL includes comm/mpi.hpp or comm/nccl.hpp (pmt.hpp
// does), where Communicator<Mpi> and Communicator<Nccl> are defined. A communicator of one rank communicates nothing:
// every region is then the identity (scatter_to and gather_from return x itself).
// Inference across pipeline stages (forward only, so no conjugate): hand_on sends this stage's
// output to the stage that goes on with it, take_over receives it there, share_from gives every
// rank of the axis the last stage's result (blocking; tag 0, so NCCL's matching rule holds).

#include "pmt/comm/backend.hpp"
#include "pmt/comm/collectives.hpp"
#include "pmt/comm/communicator.hpp"
#include "pmt/core/error.hpp"
#include "pmt/core/tensor.hpp"
#include "pmt/core/workspace.hpp"

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>

namespace pmt::parallel {

/// \brief The reduction of reduce_from (Sum by default; Max for a row's maximum).
using comm::ReduceOp;

/// \brief Forward of copy_to: x itself (every rank of the axis uses the whole tensor).
template <class B, class Exec, class V>
V copy_to(const comm::Communicator<B>&, const Exec&, const V& x) {
  return x;
}
/// \brief Backward of copy_to: dx summed over the axis, in place.
template <class B, class Exec, class V>
void copy_to_backward(const comm::Communicator<B>& axis, const Exec& exec, const V& dx) {
  if (axis.size() > 1) comm::all_reduce(axis, exec, dx, ReduceOp::Sum);
}
/// \brief Forward of reduce_from: the ranks' partial results combined over the axis (a sum, or
/// `op`), in place.
template <class B, class Exec, class V>
void reduce_from(const comm::Communicator<B>& axis, const Exec& exec, const V& x, ReduceOp op = ReduceOp::Sum) {
  if (axis.size() > 1) comm::all_reduce(axis, exec, x, op);
}
/// \brief Backward of reduce_from: dy itself.
template <class B, class Exec, class V>
V reduce_from_backward(const comm::Communicator<B>&, const Exec&, const V& dy) {
  return dy;
}

/// \brief This rank's block of columns of x (N, C): columns [r C/p, (r + 1) C/p).
/// \throws pmt::ShapeError when p does not divide C.
template <class B, class Exec, class V>
Tensor<typename V::non_const_value_type, 2, Exec> scatter_to(const comm::Communicator<B>& axis, const Exec& exec,
                                                             const V& x) {
  using T = typename V::non_const_value_type;
  static_assert(V::rank == 2, "pmt::parallel::scatter_to: x must be (N, C)");
  const auto p = static_cast<std::size_t>(axis.size());
  if (p == 1) return x;
  pmt::detail::require(x.extent(1) % p == 0, "pmt::parallel::scatter_to", [&] {
    return pmt::detail::str("x is ", shape_str(x), "; its ", x.extent(1), " columns do not divide over ", p, " ranks");
  });
  const std::size_t c = x.extent(1) / p, c0 = static_cast<std::size_t>(axis.rank()) * c;
  auto out = workspace_view<Tensor<T, 2, Exec>>("pmt::parallel::scatter_to", x.extent(0), c);
  Kokkos::deep_copy(exec, out, Kokkos::subview(x, Kokkos::ALL, std::make_pair(c0, c0 + c)));
  return out;
}
/// \brief Every rank's x (N, c) side by side: (N, c p), rank r's block at columns [r c, (r+1) c).
template <class B, class Exec, class V>
Tensor<typename V::non_const_value_type, 2, Exec> gather_from(const comm::Communicator<B>& axis, const Exec& exec,
                                                              const V& x) {
  using T = typename V::non_const_value_type;
  static_assert(V::rank == 2, "pmt::parallel::gather_from: x must be (N, c)");
  const auto p = static_cast<std::size_t>(axis.size());
  if (p == 1) return x;
  const std::size_t N = x.extent(0), c = x.extent(1);
  auto blocks = workspace_view<Tensor<T, 1, Exec>>("pmt::parallel::gather_from::blocks", p * N * c);
  const Kokkos::View<const T*, Kokkos::LayoutRight, typename Exec::memory_space,
                     Kokkos::MemoryTraits<Kokkos::Unmanaged>>
      mine(x.data(), N * c);
  comm::all_gather(axis, exec, mine, blocks);
  auto out = workspace_view<Tensor<T, 2, Exec>>("pmt::parallel::gather_from", N, c * p);
  Kokkos::parallel_for(
      "pmt::parallel::gather_from", Kokkos::RangePolicy<Exec>(exec, 0, static_cast<std::int64_t>(N)),
      KOKKOS_LAMBDA(std::int64_t n) {
        for (std::size_t r = 0; r < p; ++r)
          for (std::size_t j = 0; j < c; ++j) out(n, r * c + j) = blocks((r * N + static_cast<std::size_t>(n)) * c + j);
      });
  return out;
}
/// \brief Backward of scatter_to: gather_from of the column gradients.
template <class B, class Exec, class V>
Tensor<typename V::non_const_value_type, 2, Exec> scatter_to_backward(const comm::Communicator<B>& axis,
                                                                      const Exec& exec, const V& dy) {
  return gather_from(axis, exec, dy);
}
/// \brief Backward of gather_from: this rank's block of the gradient's columns.
template <class B, class Exec, class V>
Tensor<typename V::non_const_value_type, 2, Exec> gather_from_backward(const comm::Communicator<B>& axis,
                                                                       const Exec& exec, const V& dy) {
  return scatter_to(axis, exec, dy);
}

/// \brief The rows (tokens) this rank holds when N rows are split over the axis: N / p.
/// \throws pmt::ShapeError when p does not divide N (naming `op`).
template <class B>
std::size_t local_rows(const comm::Communicator<B>& axis, std::size_t N, const char* op) {
  const auto p = static_cast<std::size_t>(axis.size());
  pmt::detail::require(N % p == 0, op, [&] {
    return pmt::detail::str("sequence parallelism splits the ", N, " rows (B T tokens) over tp = ", p,
                            ", which does not divide them; choose B T divisible by tp");
  });
  return N / p;
}

/// \brief Forward of sequence parallelism's gather: every rank's rows x (n, C) stacked in rank
/// order, (n p, C). Backward: reduce_scatter_rows.
template <class B, class Exec, class V>
Tensor<typename V::non_const_value_type, 2, Exec> gather_rows(const comm::Communicator<B>& axis, const Exec& exec,
                                                              const V& x) {
  using T = typename V::non_const_value_type;
  static_assert(V::rank == 2, "pmt::parallel::gather_rows: x must be (n, C)");
  const auto p = static_cast<std::size_t>(axis.size());
  if (p == 1) return x;
  auto out = workspace_view<Tensor<T, 2, Exec>>("pmt::parallel::gather_rows", x.extent(0) * p, x.extent(1));
  comm::all_gather(axis, exec, x, out);  // row blocks are contiguous in LayoutRight
  return out;
}
/// \brief Forward of sequence parallelism's reduce-scatter: x (N, C) summed over the axis, this
/// rank keeping its rows, (N/p, C). Backward: gather_rows.
/// \throws pmt::ShapeError when p does not divide N.
template <class B, class Exec, class V>
Tensor<typename V::non_const_value_type, 2, Exec> reduce_scatter_rows(const comm::Communicator<B>& axis,
                                                                      const Exec& exec, const V& x) {
  using T = typename V::non_const_value_type;
  static_assert(V::rank == 2, "pmt::parallel::reduce_scatter_rows: x must be (N, C)");
  if (axis.size() == 1) return x;
  const std::size_t n = local_rows(axis, x.extent(0), "pmt::parallel::reduce_scatter_rows");
  auto out            = workspace_view<Tensor<T, 2, Exec>>("pmt::parallel::reduce_scatter_rows", n, x.extent(1));
  comm::reduce_scatter(axis, exec, x, out, ReduceOp::Sum);
  return out;
}
/// \brief Forward of sequence parallelism's split: this rank's rows of x (N, C), (N/p, C), a copy.
/// Backward: gather_rows. \throws pmt::ShapeError when p does not divide N.
template <class B, class Exec, class V>
Tensor<typename V::non_const_value_type, 2, Exec> split_rows(const comm::Communicator<B>& axis, const Exec& exec,
                                                             const V& x) {
  using T = typename V::non_const_value_type;
  static_assert(V::rank == 2, "pmt::parallel::split_rows: x must be (N, C)");
  if (axis.size() == 1) return x;
  const std::size_t n  = local_rows(axis, x.extent(0), "pmt::parallel::split_rows"),
                    r0 = n * static_cast<std::size_t>(axis.rank());
  auto out             = workspace_view<Tensor<T, 2, Exec>>("pmt::parallel::split_rows", n, x.extent(1));
  Kokkos::deep_copy(exec, out, Kokkos::subview(x, std::make_pair(r0, r0 + n), Kokkos::ALL));
  return out;
}

/// \brief Inference hand-off: this rank's output x to rank `to` of the axis (blocking).
template <class B, class Exec, class V>
void hand_on(const comm::Communicator<B>& axis, const Exec& exec, const V& x, int to) {
  comm::send(axis, exec, x, to);
}
/// \brief Inference hand-off: the (rows, cols) tensor rank `from` of the axis hands on (blocking).
template <class T, class B, class Exec>
Tensor<T, 2, Exec> take_over(const comm::Communicator<B>& axis, const Exec& exec, std::size_t rows, std::size_t cols,
                             int from) {
  Tensor<T, 2, Exec> x("pmt::parallel::take_over", rows, cols);
  comm::recv(axis, exec, x, from);
  return x;
}
/// \brief Inference result: rank `root`'s x on every rank of the axis; the others pass a tensor
/// of its shape, which is filled (x itself is returned).
template <class B, class Exec, class V>
V share_from(const comm::Communicator<B>& axis, const Exec& exec, const V& x, int root) {
  if (axis.size() > 1) comm::broadcast(axis, exec, x, root);
  return x;
}

}  // namespace pmt::parallel
