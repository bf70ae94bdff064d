// SPDX-License-Identifier: Apache-2.0
#pragma once
// Collectives on Views, written once for every backend. Each takes the communicator, then the
// execution-space instance the data is ordered with, then contiguous Views of one element type.
// The front end checks the types and extents, applies the in-place rules below, divides for
// ReduceOp::Avg, and in debug mode first makes all ranks agree on what they are about to call.
//
// Semantics and in-place rules (NCCL's conventions):
//   all_reduce(c, exec, send, recv, op)   recv = op over ranks of send; send.size() == recv.size().
//                                         In place: pass the same View (or all_reduce(c, exec, buf, op)).
//   reduce_scatter(c, exec, send, recv, op)  send holds size() blocks of recv.size(); rank r receives
//                                         op over ranks of block r. In place: recv is block rank() of send.
//   all_gather(c, exec, send, recv)       recv holds size() blocks of send.size(), block r from rank r.
//                                         In place: send is block rank() of recv.
//   broadcast(c, exec, buf, root)         every rank's buf = root's buf.
//   send / recv(c, exec, buf, peer, tag)  point to point; blocking.
//   iall_reduce / ireduce_scatter / iall_gather / isend / irecv
//                                         non-blocking; the Request keeps the Views alive.
// Errors: pmt::ShapeError for wrong extents or non-contiguous Views, pmt::ConfigError for a bad
// root/peer or Avg on integers, pmt::CommError from the backend or a debug-mode mismatch.

#include "pmt/comm/backend.hpp"
#include "pmt/comm/communicator.hpp"
#include "pmt/comm/request.hpp"
#include "pmt/comm/stats.hpp"
#include "pmt/core/error.hpp"
#include "pmt/core/instrument.hpp"
#include "pmt/core/tensor.hpp"
#include "pmt/core/workspace.hpp"

#include <Kokkos_Core.hpp>

#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace pmt::detail {

template <class C>
std::string comm_where(const C& c) {
  return str(" (communicator rank ", c.rank(), " of ", c.size(), ")");
}

template <class Exec, class V>
void check_comm_view(const char* op, const char* name, const V& v) {
  static_check_view<Exec, V>();
  require(v.span_is_contiguous(), op,
          [&] { return str(name, " is ", shape_str(v), " but not contiguous; collectives need contiguous Views"); });
}

/// Debug mode: all ranks exchange what they are about to call and raise together on a mismatch.
template <class C>
void agree_on_collective(const C& c, const char* op, CollectiveKind kind, comm::DataType t, std::size_t count,
                         int extra) {
  if (!c.debug()) return;
  Fingerprint mine;
  mine.op                            = static_cast<std::int32_t>(kind);
  mine.dtype                         = static_cast<std::int32_t>(t);
  mine.extra                         = extra;
  mine.count                         = count;
  mine.seq                           = c.next_sequence();
  const std::vector<Fingerprint> all = c.gather_fingerprints(mine);
  std::string differ;
  for (std::size_t r = 1; r < all.size(); ++r) {
    const Fingerprint& f = all[r];
    if (f.op != all[0].op || f.dtype != all[0].dtype || f.extra != all[0].extra || f.count != all[0].count ||
        f.seq != all[0].seq)
      differ += str("; rank ", r, " calls ", describe(f));
  }
  if (!differ.empty())
    throw CommError(op, str("collective mismatch on a communicator of ", all.size(), " ranks: rank 0 calls ",
                            describe(all[0]), differ, comm_where(c)));
}

template <class T>
void require_avg_type(const char* op, comm::ReduceOp rop) {
  require<ConfigError>(rop != comm::ReduceOp::Avg || std::is_floating_point_v<T>, op, [] {
    return std::string("ReduceOp::Avg needs a floating-point element type; use Sum and divide");
  });
}

/// v *= 1 / n on exec (Avg after a Sum).
template <class Exec, class V>
void divide_by(const Exec& exec, const V& v, int n) {
  using T = typename V::non_const_value_type;
  if constexpr (std::is_floating_point_v<T>) {  // Avg on other types is refused before any communication
    auto f    = flat(v);
    const T s = T(1) / static_cast<T>(n);
    Kokkos::parallel_for(
        "pmt::comm::avg", Kokkos::RangePolicy<Exec>(exec, 0, f.extent(0)), KOKKOS_LAMBDA(std::size_t i) { f(i) *= s; });
  } else {
    (void)exec, (void)v, (void)n;
  }
}

/// The checks all_reduce and iall_reduce share: contiguous Views of one size, Avg only on floats,
/// then (debug mode) the agreement of all ranks.
template <class Exec, class C, class SV, class RV>
void check_all_reduce(const char* name, const C& c, const SV& send, const RV& recv, comm::ReduceOp op) {
  using T = typename RV::non_const_value_type;
  static_assert(std::is_same_v<typename SV::non_const_value_type, T>,
                "pmt::comm::all_reduce: send and recv must have the same element type");
  check_comm_view<Exec>(name, "send", send);
  check_comm_view<Exec>(name, "recv", recv);
  require(send.size() == recv.size(), name, [&] {
    return str("send is ", shape_str(send), " but recv is ", shape_str(recv), "; expected the same number of elements",
               comm_where(c));
  });
  require_avg_type<T>(name, op);
  agree_on_collective(c, name, CollectiveKind::AllReduce, comm::data_type_of<T>(), recv.size(), static_cast<int>(op));
}

/// all_gather's views: on Exec's space, recv holding size() blocks of send.
template <class Exec, class C, class SV, class RV>
void check_all_gather(const char* name, const C& c, const SV& send, const RV& recv) {
  check_comm_view<Exec>(name, "send", send);
  check_comm_view<Exec>(name, "recv", recv);
  require(recv.size() == send.size() * static_cast<std::size_t>(c.size()), name, [&] {
    return str("send is ", shape_str(send), " and recv is ", shape_str(recv),
               "; expected recv to hold size() = ", c.size(), " blocks of send's ", send.size(), " elements",
               comm_where(c));
  });
}

/// reduce_scatter's views: on Exec's space, send holding size() blocks of recv.
template <class Exec, class C, class SV, class RV>
void check_reduce_scatter(const char* name, const C& c, const SV& send, const RV& recv) {
  check_comm_view<Exec>(name, "send", send);
  check_comm_view<Exec>(name, "recv", recv);
  require(send.size() == recv.size() * static_cast<std::size_t>(c.size()), name, [&] {
    return str("send is ", shape_str(send), " and recv is ", shape_str(recv),
               "; expected send to hold size() = ", c.size(), " blocks of recv's ", recv.size(), " elements",
               comm_where(c));
  });
}

template <class C>
void require_rank(const char* op, const char* what, int r, const C& c) {
  require<ConfigError>(r >= 0 && r < c.size(), op,
                       [&] { return str(what, " is ", r, "; expected a rank in [0, ", c.size(), ")", comm_where(c)); });
}

}  // namespace pmt::detail

namespace pmt::comm {

// ---------------------------------------------------------------------------------------------

/// \brief recv = op over all ranks of send (out of place, or in place when they are one View).
/// \throws pmt::ShapeError when sizes differ; pmt::ConfigError for Avg on integers;
/// pmt::CommError from the backend or a debug-mode mismatch.
template <class B, class Exec, class SV, class RV, std::enable_if_t<Kokkos::is_view<RV>::value, int> = 0>
void all_reduce(const Communicator<B>& c, const Exec& exec, const SV& send, const RV& recv,
                ReduceOp op = ReduceOp::Sum) {
  const Instrument instrument("pmt::comm::all_reduce", Track::Collective, "all_reduce");
  const detail::CommTimer timer("all_reduce");
  using T = typename RV::non_const_value_type;
  detail::check_all_reduce<Exec>("pmt::comm::all_reduce", c, send, recv, op);
  c.all_reduce_raw(exec, send.data(), recv.data(), recv.size(), data_type_of<T>(), op);
  if (op == ReduceOp::Avg && c.size() > 1) detail::divide_by(exec, recv, c.size());
}

/// \brief In-place all_reduce: buf = op over all ranks of buf.
template <class B, class Exec, class V>
void all_reduce(const Communicator<B>& c, const Exec& exec, const V& buf, ReduceOp op = ReduceOp::Sum) {
  all_reduce(c, exec, buf, buf, op);
}

/// \brief In-place all_reduce of a few values in host memory (a loss, a norm's partial sums),
/// whatever the backend: Self and MPI reduce them where they are; NCCL, which reads device memory
/// only, reduces a device copy on `exec`'s stream and copies the result back (fenced).
template <class B, class Exec, class V>
void all_reduce_host_values(const Communicator<B>& c, const Exec& exec, const V& values, ReduceOp op = ReduceOp::Sum) {
  static_assert(Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename V::memory_space>::accessible,
                "pmt::comm::all_reduce_host_values: the values must be in host memory");
  using T = typename V::non_const_value_type;
  Kokkos::View<T*, Kokkos::LayoutRight, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> host(values.data(),
                                                                                                         values.size());
  if constexpr (std::is_same_v<B, Nccl>) {
    auto dev = workspace_view<Kokkos::View<T*, Kokkos::LayoutRight, typename Exec::memory_space>>(
        "pmt::comm::host_values", host.size());
    Kokkos::deep_copy(exec, dev, host);
    all_reduce(c, exec, dev, op);
    Kokkos::deep_copy(exec, host, dev);
    exec.fence("pmt::comm::all_reduce_host_values");
  } else {
    (void)exec;
    all_reduce(c, Kokkos::DefaultHostExecutionSpace(), host, op);
  }
}

/// \brief Block r of send (send.size() / size() elements), reduced over ranks, lands in recv on rank r.
/// \throws pmt::ShapeError unless send.size() == size() * recv.size().
template <class B, class Exec, class SV, class RV>
void reduce_scatter(const Communicator<B>& c, const Exec& exec, const SV& send, const RV& recv,
                    ReduceOp op = ReduceOp::Sum) {
  const Instrument instrument("pmt::comm::reduce_scatter", Track::Collective, "reduce_scatter");
  const detail::CommTimer timer("reduce_scatter");
  using T = typename RV::non_const_value_type;
  static_assert(std::is_same_v<typename SV::non_const_value_type, T>,
                "pmt::comm::reduce_scatter: send and recv must have the same element type");
  constexpr const char* name = "pmt::comm::reduce_scatter";
  detail::check_reduce_scatter<Exec>(name, c, send, recv);
  detail::require_avg_type<T>(name, op);
  detail::agree_on_collective(c, name, detail::CollectiveKind::ReduceScatter, data_type_of<T>(), recv.size(),
                              static_cast<int>(op));
  c.reduce_scatter_raw(exec, send.data(), recv.data(), recv.size(), data_type_of<T>(), op);
  if (op == ReduceOp::Avg && c.size() > 1) detail::divide_by(exec, recv, c.size());
}

/// \brief recv = the concatenation of every rank's send, in rank order.
/// \throws pmt::ShapeError unless recv.size() == size() * send.size().
template <class B, class Exec, class SV, class RV>
void all_gather(const Communicator<B>& c, const Exec& exec, const SV& send, const RV& recv) {
  const Instrument instrument("pmt::comm::all_gather", Track::Collective, "all_gather");
  const detail::CommTimer timer("all_gather");
  using T = typename RV::non_const_value_type;
  static_assert(std::is_same_v<typename SV::non_const_value_type, T>,
                "pmt::comm::all_gather: send and recv must have the same element type");
  constexpr const char* name = "pmt::comm::all_gather";
  detail::check_all_gather<Exec>(name, c, send, recv);
  detail::agree_on_collective(c, name, detail::CollectiveKind::AllGather, data_type_of<T>(), send.size(), 0);
  c.all_gather_raw(exec, send.data(), recv.data(), send.size(), data_type_of<T>());
}

/// \brief Every rank's buf = root's buf. \throws pmt::ConfigError for a root outside [0, size()).
template <class B, class Exec, class V>
void broadcast(const Communicator<B>& c, const Exec& exec, const V& buf, int root) {
  const Instrument instrument("pmt::comm::broadcast", Track::Collective, "broadcast");
  const detail::CommTimer timer("broadcast");
  using T                    = typename V::non_const_value_type;
  constexpr const char* name = "pmt::comm::broadcast";
  detail::check_comm_view<Exec>(name, "buf", buf);
  detail::require_rank(name, "root", root, c);
  detail::agree_on_collective(c, name, detail::CollectiveKind::Broadcast, data_type_of<T>(), buf.size(), root);
  c.broadcast_raw(exec, buf.data(), buf.size(), data_type_of<T>(), root);
}

/// \brief Runs `f`, which issues non-blocking operations on `c`, as one group: they are posted
/// together (ncclGroupStart / End on NCCL) and, where operations are stream-ordered
/// (c.stream_ordered<Exec>(): NCCL on a GPU, the MPI backend under PMT_COMM_RULES=nccl),
/// complete together at its end. An exchange between two ranks is a group of a receive and a send
/// on each; without the group a stream-ordered receive issued first would wait forever.
/// \code
/// pmt::comm::Request rq, sq;
/// pmt::comm::group(pp, exec, [&] {
///   rq = pmt::comm::irecv(pp, exec, theirs, peer);
///   sq = pmt::comm::isend(pp, exec, mine, peer);
/// });
/// rq.wait(), sq.wait();
/// \endcode
/// \throws pmt::CommError from the backend, or for a blocking send or receive inside the group.
template <class B, class Exec, class F>
void group(const Communicator<B>& c, const Exec& exec, F&& f) {
  c.group_start();
  try {
    f();
  } catch (...) {
    c.group_cancel();  // closes the group without waiting for peers that may never come
    throw;
  }
  c.group_end(exec);
}

/// \brief Blocking send of buf to rank `peer` with `tag`.
template <class B, class Exec, class V>
void send(const Communicator<B>& c, const Exec& exec, const V& buf, int peer, int tag = 0) {
  const Instrument instrument("pmt::comm::send", Track::P2P, "send");
  const detail::CommTimer timer("send");
  detail::check_comm_view<Exec>("pmt::comm::send", "buf", buf);
  detail::require_rank("pmt::comm::send", "peer", peer, c);
  c.send_raw(exec, buf.data(), buf.size(), data_type_of<typename V::non_const_value_type>(), peer, tag);
}

/// \brief Blocking receive into buf from rank `peer` with `tag` (the message must have buf.size() elements).
template <class B, class Exec, class V>
void recv(const Communicator<B>& c, const Exec& exec, const V& buf, int peer, int tag = 0) {
  const Instrument instrument("pmt::comm::recv", Track::P2P, "recv");
  const detail::CommTimer timer("recv");
  detail::check_comm_view<Exec>("pmt::comm::recv", "buf", buf);
  detail::require_rank("pmt::comm::recv", "peer", peer, c);
  c.recv_raw(exec, buf.data(), buf.size(), data_type_of<typename V::non_const_value_type>(), peer, tag);
}

/// \brief Non-blocking all_reduce (out of place, or in place with one View). The result is valid
/// after Request::wait() (or test() == true); Avg's division runs at completion.
template <class B, class Exec, class SV, class RV, std::enable_if_t<Kokkos::is_view<RV>::value, int> = 0>
[[nodiscard]] Request iall_reduce(const Communicator<B>& c, const Exec& exec, const SV& send, const RV& recv,
                                  ReduceOp op = ReduceOp::Sum) {
  using T = typename RV::non_const_value_type;
  detail::check_all_reduce<Exec>("pmt::comm::iall_reduce", c, send, recv, op);
  std::function<void()> on_complete;
  if (op == ReduceOp::Avg && c.size() > 1) {
    const int n = c.size();
    on_complete = [exec, recv, n] { detail::divide_by(exec, recv, n); };
  }
  return c.iall_reduce_raw(exec, send.data(), recv.data(), recv.size(), data_type_of<T>(), op,
                           std::make_shared<std::pair<SV, RV>>(send, recv), std::move(on_complete));
}

/// \brief Non-blocking in-place all_reduce.
template <class B, class Exec, class V>
[[nodiscard]] Request iall_reduce(const Communicator<B>& c, const Exec& exec, const V& buf,
                                  ReduceOp op = ReduceOp::Sum) {
  return iall_reduce(c, exec, buf, buf, op);
}

/// \brief Non-blocking reduce_scatter (out of place): block r of send, reduced over ranks, lands
/// in recv on rank r once the Request completes; neither may change until then (Sum, Max or Min:
/// Avg's division would need the completion, so it is refused).
/// \throws pmt::ShapeError unless send.size() == size() * recv.size(); pmt::ConfigError for Avg.
template <class B, class Exec, class SV, class RV>
[[nodiscard]] Request ireduce_scatter(const Communicator<B>& c, const Exec& exec, const SV& send, const RV& recv,
                                      ReduceOp op = ReduceOp::Sum) {
  using T = typename RV::non_const_value_type;
  static_assert(std::is_same_v<typename SV::non_const_value_type, T>,
                "pmt::comm::ireduce_scatter: send and recv must have the same element type");
  constexpr const char* name = "pmt::comm::ireduce_scatter";
  detail::check_reduce_scatter<Exec>(name, c, send, recv);
  detail::require<ConfigError>(op != ReduceOp::Avg, name, [&] {
    return std::string("ReduceOp::Avg is not offered non-blocking; use Sum and scale the result");
  });
  detail::agree_on_collective(c, name, detail::CollectiveKind::ReduceScatter, data_type_of<T>(), recv.size(),
                              static_cast<int>(op));
  return c.ireduce_scatter_raw(exec, send.data(), recv.data(), recv.size(), data_type_of<T>(), op,
                               std::make_shared<std::pair<SV, RV>>(send, recv));
}

/// \brief Non-blocking all_gather (out of place): every rank's send, in rank order, lands in recv
/// once the Request completes; neither may change until then.
/// \throws pmt::ShapeError unless recv.size() == size() * send.size().
template <class B, class Exec, class SV, class RV>
[[nodiscard]] Request iall_gather(const Communicator<B>& c, const Exec& exec, const SV& send, const RV& recv) {
  using T = typename RV::non_const_value_type;
  static_assert(std::is_same_v<typename SV::non_const_value_type, T>,
                "pmt::comm::iall_gather: send and recv must have the same element type");
  constexpr const char* name = "pmt::comm::iall_gather";
  detail::check_all_gather<Exec>(name, c, send, recv);
  detail::agree_on_collective(c, name, detail::CollectiveKind::AllGather, data_type_of<T>(), send.size(), 0);
  return c.iall_gather_raw(exec, send.data(), recv.data(), send.size(), data_type_of<T>(),
                           std::make_shared<std::pair<SV, RV>>(send, recv));
}

/// \brief Non-blocking send; buf must not change until the Request completes.
template <class B, class Exec, class V>
[[nodiscard]] Request isend(const Communicator<B>& c, const Exec& exec, const V& buf, int peer, int tag = 0) {
  detail::check_comm_view<Exec>("pmt::comm::isend", "buf", buf);
  detail::require_rank("pmt::comm::isend", "peer", peer, c);
  return c.isend_raw(exec, buf.data(), buf.size(), data_type_of<typename V::non_const_value_type>(), peer, tag,
                     std::make_shared<V>(buf));
}

/// \brief Non-blocking receive; buf holds the message once the Request completes.
template <class B, class Exec, class V>
[[nodiscard]] Request irecv(const Communicator<B>& c, const Exec& exec, const V& buf, int peer, int tag = 0) {
  detail::check_comm_view<Exec>("pmt::comm::irecv", "buf", buf);
  detail::require_rank("pmt::comm::irecv", "peer", peer, c);
  return c.irecv_raw(exec, buf.data(), buf.size(), data_type_of<typename V::non_const_value_type>(), peer, tag,
                     std::make_shared<V>(buf));
}

/// \brief Barrier (in debug mode preceded by the agreement check).
template <class B>
void barrier(const Communicator<B>& c) {
  const Instrument instrument("pmt::comm::barrier", Track::Collective, "barrier");
  const detail::CommTimer timer("barrier");
  detail::agree_on_collective(c, "pmt::comm::barrier", detail::CollectiveKind::Barrier, DataType::UInt8, 0, 0);
  c.barrier();
}

}  // namespace pmt::comm
