// SPDX-License-Identifier: Apache-2.0
#pragma once
// The communicator concept and its one-rank backend, Communicator<Self>.
//
// A Communicator<Backend> provides rank(), size(), split(color, key), barrier(), debug() /
// set_debug(), and raw operations on contiguous buffers that the generic collectives in
// comm/collectives.hpp call after checking shapes: all_reduce_raw, reduce_scatter_raw,
// all_gather_raw, broadcast_raw, send_raw, recv_raw, iall_reduce_raw, ireduce_scatter_raw,
// iall_gather_raw, isend_raw, irecv_raw, and gather_fingerprints (debug mode). Each raw op takes
// the execution-space instance first and is ordered with it: Self copies on the instance, Mpi
// fences it first, Nccl enqueues on its stream.
// Groups: group_start() / group_end(exec) (or group_cancel() on an error) bracket operations posted together (NCCL's
// ncclGroupStart / End; comm::group in comm/collectives.hpp), and stream_ordered<Exec>() says
// whether an operation outside a group holds everything issued after it until it completes (NCCL
// on a GPU stream, and the MPI backend under PMT_COMM_RULES=nccl): a send must then be grouped
// with the receive that pairs with it, and a receive is issued where its data is needed, not ahead.
// Copies of a communicator share one underlying communicator.

#include "pmt/comm/backend.hpp"
#include "pmt/comm/request.hpp"
#include "pmt/core/error.hpp"

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace pmt::comm {

/// \brief A group of ranks of one backend (see the file comment): rank(), size(), split(),
/// barrier() and the raw operations the collectives of comm/collectives.hpp call.
/// Communicator<Self> (one rank) is here, Communicator<Mpi> in comm/mpi.hpp, Communicator<Nccl> in
/// comm/nccl.hpp. \throws pmt::CommError from the backend.
template <class Backend>
class Communicator;

}  // namespace pmt::comm

namespace pmt::detail {

/// What a rank is about to do in a collective; in debug mode all ranks compare theirs first.
struct Fingerprint {
  std::int32_t op     = 0;  // CollectiveKind
  std::int32_t dtype  = 0;
  std::int32_t extra  = 0;  // reduce op or root
  std::int32_t pad    = 0;
  std::uint64_t count = 0;
  std::uint64_t seq   = 0;
};

enum class CollectiveKind : std::int32_t { AllReduce = 1, ReduceScatter, AllGather, Broadcast, Barrier };

inline const char* to_string(CollectiveKind k) {
  switch (k) {
    case CollectiveKind::AllReduce:
      return "all_reduce";
    case CollectiveKind::ReduceScatter:
      return "reduce_scatter";
    case CollectiveKind::AllGather:
      return "all_gather";
    case CollectiveKind::Broadcast:
      return "broadcast";
    case CollectiveKind::Barrier:
      return "barrier";
  }
  return "?";
}

inline std::string describe(const Fingerprint& f) {
  const auto kind = static_cast<CollectiveKind>(f.op);
  std::string extra;
  if (kind == CollectiveKind::AllReduce || kind == CollectiveKind::ReduceScatter)
    extra = std::string(", ") + comm::to_string(static_cast<comm::ReduceOp>(f.extra));
  if (kind == CollectiveKind::Broadcast) extra = ", root " + std::to_string(f.extra);
  return str(to_string(kind), "(count ", f.count, ", ", comm::to_string(static_cast<comm::DataType>(f.dtype)), extra,
             ") as collective #", f.seq);
}

/// Debug switch and collective counter shared by the copies of one communicator. Debug mode is on
/// when pmt is built with PMT_DEBUG=1 or the environment sets PMT_DEBUG_COLLECTIVES=1.
struct CommDebugState {
  bool enabled       = default_enabled();
  std::uint64_t next = 0;
  static bool default_enabled() {
#if defined(PMT_DEBUG) && PMT_DEBUG
    return true;
#else
    const char* env = std::getenv("PMT_DEBUG_COLLECTIVES");
    return env != nullptr && env[0] != '\0' && std::strcmp(env, "0") != 0;
#endif
  }
};

/// An unmanaged byte view over `bytes` bytes at `p` in memory space Mem.
template <class Mem>
Kokkos::View<char*, Mem, Kokkos::MemoryTraits<Kokkos::Unmanaged>> byte_view(const void* p, std::size_t bytes) {
  return Kokkos::View<char*, Mem, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(static_cast<char*>(const_cast<void*>(p)),
                                                                           bytes);
}

}  // namespace pmt::detail

namespace pmt::comm {

// ---------------------------------------------------------------------------------------------

/// \brief The one-rank communicator: rank 0 of 1. Collectives copy (out of place) or do nothing
/// (in place); send/recv go through a mailbox, so a recv must follow its matching send.
/// Communication: none.
template <>
class Communicator<Self> {
 public:
  using backend = Self;

  Communicator() : m_state(std::make_shared<State>()) {}

  int rank() const noexcept { return 0; }
  int size() const noexcept { return 1; }
  /// \brief A new one-rank communicator (its own mailbox).
  Communicator split(int /*color*/, int /*key*/) const { return Communicator(); }
  void barrier() const noexcept {}
  bool debug() const noexcept { return m_state->debug.enabled; }
  void set_debug(bool on) const noexcept { m_state->debug.enabled = on; }
  std::uint64_t next_sequence() const noexcept { return m_state->debug.next++; }
  std::string name() const { return "pmt::comm::Communicator<Self>"; }
  /// \brief Point-to-point operations are not stream-ordered: a receive completes when waited for.
  template <class Exec>
  bool stream_ordered() const noexcept {
    return false;
  }
  void group_start() const noexcept {}
  void group_cancel() const noexcept {}
  template <class Exec>
  void group_end(const Exec&) const noexcept {}

  template <class Exec>
  void all_reduce_raw(const Exec& exec, const void* send, void* recv, std::size_t count, DataType t, ReduceOp) const {
    copy(exec, send, recv, count * size_of(t));
  }
  template <class Exec>
  void reduce_scatter_raw(const Exec& exec, const void* send, void* recv, std::size_t recv_count, DataType t,
                          ReduceOp) const {
    copy(exec, send, recv, recv_count * size_of(t));
  }
  template <class Exec>
  void all_gather_raw(const Exec& exec, const void* send, void* recv, std::size_t send_count, DataType t) const {
    copy(exec, send, recv, send_count * size_of(t));
  }
  template <class Exec>
  void broadcast_raw(const Exec&, void*, std::size_t, DataType, int) const {}

  template <class Exec>
  void send_raw(const Exec& exec, const void* buf, std::size_t count, DataType t, int /*peer*/, int tag) const {
    Kokkos::View<char*, Kokkos::HostSpace> msg("pmt::comm::Self::message", count * size_of(t));
    Kokkos::deep_copy(exec, msg, detail::byte_view<typename Exec::memory_space>(buf, msg.size()));
    exec.fence();
    m_state->mailbox.push_back({tag, msg});
  }
  template <class Exec>
  void recv_raw(const Exec& exec, void* buf, std::size_t count, DataType t, int /*peer*/, int tag) const {
    if (!try_recv(exec, buf, count * size_of(t), tag))
      throw CommError("pmt::comm::Communicator<Self>::recv",
                      detail::str("no message with tag ", tag,
                                  " was sent to this rank; on a one-rank communicator a recv must "
                                  "follow its send"));
  }
  template <class Exec>
  Request iall_reduce_raw(const Exec& exec, const void* send, void* recv, std::size_t count, DataType t, ReduceOp op,
                          std::shared_ptr<void> keep, std::function<void()> on_complete) const {
    all_reduce_raw(exec, send, recv, count, t, op);
    if (on_complete) on_complete();
    (void)keep;
    return Request();
  }
  template <class Exec>
  Request ireduce_scatter_raw(const Exec& exec, const void* send, void* recv, std::size_t recv_count, DataType t,
                              ReduceOp op, std::shared_ptr<void> keep) const {
    reduce_scatter_raw(exec, send, recv, recv_count, t, op);
    (void)keep;
    return Request();
  }
  template <class Exec>
  Request iall_gather_raw(const Exec& exec, const void* send, void* recv, std::size_t send_count, DataType t,
                          std::shared_ptr<void> keep) const {
    all_gather_raw(exec, send, recv, send_count, t);
    (void)keep;
    return Request();
  }
  template <class Exec>
  Request isend_raw(const Exec& exec, const void* buf, std::size_t count, DataType t, int peer, int tag,
                    std::shared_ptr<void> keep) const {
    send_raw(exec, buf, count, t, peer, tag);
    (void)keep;
    return Request();
  }
  template <class Exec>
  Request irecv_raw(const Exec& exec, void* buf, std::size_t count, DataType t, int /*peer*/, int tag,
                    std::shared_ptr<void> keep) const {
    const std::size_t bytes = count * size_of(t);
    auto self               = *this;
    return Request(
        [self, exec, buf, bytes, tag](bool block) {
          if (self.try_recv(exec, buf, bytes, tag)) return true;
          if (block)
            throw CommError(
                "pmt::comm::Communicator<Self>::irecv",
                detail::str("waiting for tag ", tag, " that no send on this one-rank communicator provides"));
          return false;
        },
        std::move(keep));
  }
  std::vector<detail::Fingerprint> gather_fingerprints(const detail::Fingerprint& f) const { return {f}; }

 private:
  struct Message {
    int tag;
    Kokkos::View<char*, Kokkos::HostSpace> bytes;
  };
  struct State {
    detail::CommDebugState debug;
    std::deque<Message> mailbox;
  };

  template <class Exec>
  static void copy(const Exec& exec, const void* src, void* dst, std::size_t bytes) {
    if (src == dst || bytes == 0) return;
    using Mem = typename Exec::memory_space;
    Kokkos::deep_copy(exec, detail::byte_view<Mem>(dst, bytes), detail::byte_view<Mem>(src, bytes));
  }
  template <class Exec>
  bool try_recv(const Exec& exec, void* buf, std::size_t bytes, int tag) const {
    auto& box = m_state->mailbox;
    for (auto it = box.begin(); it != box.end(); ++it) {
      if (it->tag != tag) continue;
      detail::require<CommError>(it->bytes.size() == bytes, "pmt::comm::Communicator<Self>::recv", [&] {
        return detail::str("the message with tag ", tag, " has ", it->bytes.size(),
                           " bytes but the receive buffer has ", bytes);
      });
      Kokkos::deep_copy(exec, detail::byte_view<typename Exec::memory_space>(buf, bytes), it->bytes);
      exec.fence();  // the message buffer is freed below
      box.erase(it);
      return true;
    }
    return false;
  }

  std::shared_ptr<State> m_state;
};

}  // namespace pmt::comm
