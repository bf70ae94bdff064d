// SPDX-License-Identifier: Apache-2.0
#pragma once
// Communicator<Mpi>: the MPI backend (the only comm header that includes <mpi.h>).
// It duplicates the MPI_Comm it is given, so its traffic never matches the user's, and sets
// MPI_ERRORS_RETURN on the duplicate: every failing MPI call becomes a pmt::CommError naming the
// pmt op, the MPI call, MPI's error string and the rank. The execution-space instance is fenced
// before MPI touches the data. Buffers are host memory, or device memory with a CUDA-aware MPI
// (build with PMT_CUDA_AWARE_MPI=1; pmt does not check the MPI library for it).
// NCCL's rules on the CPU: with PMT_COMM_RULES=nccl in the environment (read once per process),
// point-to-point messages follow NCCL's matching instead of MPI's: tags are ignored (every
// send and receive uses one tag, so messages between a pair match in issue order, as NCCL
// matches them per stream), and a receive must get exactly the element count it posted (NCCL has
// no partial receives: a message matched out of order raises pmt::CommError naming both counts).
// The mode also models NCCL's stream order: a point-to-point operation or non-blocking
// collective issued outside a group completes where it is issued (a kernel on the one CUDA
// stream holds every later one: a receive until its message came, a send until its receiver
// took it, since sends are posted synchronously, MPI_Issend / MPI_Ssend), and the operations of
// a group (group_start / group_end, comm::group; ncclGroupStart / End) are posted together and
// complete together at its end. The exactness suites run in this mode too, so a schedule or
// layer that relied on tags, on buffered sends or on receives posted ahead of compute fails (or
// hangs under ctest's timeout) on the CPU rather than on a GPU. Outside that mode a group only
// refuses blocking sends and receives inside it; MPI progresses non-blocking operations alone.

#include "pmt/config.hpp"

#if PMT_ENABLE_MPI
#include "pmt/comm/backend.hpp"
#include "pmt/comm/communicator.hpp"
#include "pmt/comm/request.hpp"
#include "pmt/core/error.hpp"
#include "pmt/core/tensor.hpp"

#include <Kokkos_Core.hpp>

// MPI's deprecated C++ bindings (removed in MPI-3.0) are left out: they cost every translation
// unit that includes pmt a third of a second of parsing, and pmt uses the C API
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace pmt::detail {

/// Compile-time check that MPI may touch memory of Exec's space.
template <class Exec>
constexpr void static_check_mpi_space() {
  static_assert(is_host_space_v<Exec> || PMT_CUDA_AWARE_MPI,
                "pmt::comm::Mpi: this execution space's memory is not host memory; build with "
                "-DPMT_CUDA_AWARE_MPI=ON if your MPI is CUDA-aware, or use Communicator<Nccl>");
}

inline MPI_Datatype mpi_type(comm::DataType t) {
  switch (t) {
    case comm::DataType::Int8:
      return MPI_INT8_T;
    case comm::DataType::UInt8:
      return MPI_UINT8_T;
    case comm::DataType::Int32:
      return MPI_INT32_T;
    case comm::DataType::UInt32:
      return MPI_UINT32_T;
    case comm::DataType::Int64:
      return MPI_INT64_T;
    case comm::DataType::UInt64:
      return MPI_UINT64_T;
    case comm::DataType::Float32:
      return MPI_FLOAT;
    case comm::DataType::Float64:
      return MPI_DOUBLE;
    case comm::DataType::BFloat16:
      return MPI_UINT16_T;  // reduced by the bf16 operations below
  }
  return MPI_DATATYPE_NULL;
}

/// The user-defined MPI operations over bf16 (MPI has no 16-bit float): each pair of values is
/// combined in float and rounded back to bf16. Created on first use (after MPI_Init), commutative.
template <int Kind>  // 0 sum, 1 max, 2 min
void bf16_reduce(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const bf16*>(in);
  auto* b       = static_cast<bf16*>(inout);
  for (int i = 0; i < *len; ++i) {
    const float x = static_cast<float>(a[i]), y = static_cast<float>(b[i]);
    b[i] = bf16(Kind == 0 ? x + y : Kind == 1 ? (x > y ? x : y) : (x < y ? x : y));
  }
}
inline MPI_Op bf16_op(comm::ReduceOp op) {
  struct Ops {
    MPI_Op sum = MPI_OP_NULL, max = MPI_OP_NULL, min = MPI_OP_NULL;
    Ops() {
      MPI_Op_create(&bf16_reduce<0>, 1, &sum);
      MPI_Op_create(&bf16_reduce<1>, 1, &max);
      MPI_Op_create(&bf16_reduce<2>, 1, &min);
    }
  };
  static const Ops ops;
  return op == comm::ReduceOp::Max ? ops.max : op == comm::ReduceOp::Min ? ops.min : ops.sum;
}

inline MPI_Op mpi_op(comm::ReduceOp op, comm::DataType t) {
  if (t == comm::DataType::BFloat16) return bf16_op(op);
  switch (op) {
    case comm::ReduceOp::Sum:
    case comm::ReduceOp::Avg:
      return MPI_SUM;  // Avg divides afterwards
    case comm::ReduceOp::Max:
      return MPI_MAX;
    case comm::ReduceOp::Min:
      return MPI_MIN;
  }
  return MPI_OP_NULL;
}

/// The text of an MPI error code: "MPI_ERR_COUNT: invalid count argument".
inline std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, static_cast<std::size_t>(len));
}

/// Throws CommError("pmt::comm::Mpi::<op>", "<call> failed: <MPI text> (communicator rank r of n)").
inline void check_mpi(int code, const char* op, const char* call, int rank, int size) {
  if (code == MPI_SUCCESS) return;
  throw CommError(str("pmt::comm::Mpi::", op),
                  str(call, " failed: ", mpi_error_string(code), " (communicator rank ", rank, " of ", size, ")"));
}

/// MPI_Init_thread (MPI_THREAD_FUNNELED: only the thread that called Kokkos talks to MPI;
/// Kokkos' OpenMP workers never do) unless MPI is initialized already; records the world rank
/// and size for error messages. Returns whether it initialized MPI (comm/process.hpp's
/// ScopeGuard). \throws pmt::CommError when MPI_Init_thread fails.
inline bool mpi_initialize(int& argc, char**& argv) {
  int ready = 0, provided = 0;
  MPI_Initialized(&ready);
  if (!ready && MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
    throw CommError("pmt::ScopeGuard", "MPI_Init_thread failed");
  MPI_Comm_rank(MPI_COMM_WORLD, &process_context().rank);
  MPI_Comm_size(MPI_COMM_WORLD, &process_context().size);
  return !ready;
}
/// This rank's index among the ranks of its node (MPI_Comm_split_type of `world` with
/// MPI_COMM_TYPE_SHARED) and how many ranks share the node.
inline std::pair<int, int> node_local_rank(MPI_Comm world = MPI_COMM_WORLD) {
  MPI_Comm node = MPI_COMM_NULL;
  int rank = 0, size = 1;
  if (MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) != MPI_SUCCESS)
    throw CommError("pmt::detail::node_local_rank", "MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) failed");
  MPI_Comm_rank(node, &rank);
  MPI_Comm_size(node, &size);
  MPI_Comm_free(&node);
  return {rank, size};
}
/// MPI_Finalize unless MPI is finalized already.
inline void mpi_finalize() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}
/// Ends every rank of the job (MPI_Abort on MPI_COMM_WORLD).
inline void mpi_abort_world() { MPI_Abort(MPI_COMM_WORLD, 1); }
/// The MPI library's name and version, up to its first comma or line end ("Open MPI v4.1.4").
inline std::string mpi_library_version() {
  char lib[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(lib, &len);
  const std::string s(lib, static_cast<std::size_t>(len));
  return s.substr(0, s.find_first_of(",\n"));
}

/// What a receive posted: checked on completion under NCCL's rules (peer -1: a send, nothing
/// checked).
struct PostedReceive {
  std::size_t count   = 0;
  comm::DataType type = comm::DataType::UInt8;
  int peer            = -1;
};

/// A non-blocking MPI operation and what completing it checks; shared by its Request and, under
/// NCCL's rules, by the group it was issued in.
struct MpiOperation {
  MPI_Request request = MPI_REQUEST_NULL;
  bool done           = false;
  const char* op      = "";
  PostedReceive expected;
};

}  // namespace pmt::detail

namespace pmt::comm {

/// \brief Whether point-to-point messages follow NCCL's matching rules (PMT_COMM_RULES=nccl; see
/// the file comment), read once per process.
/// \throws pmt::ConfigError for another value than mpi or nccl.
inline bool nccl_matching_rules() {
  static const bool on = [] {
    const char* v           = std::getenv("PMT_COMM_RULES");
    const std::string rules = v ? v : "mpi";
    pmt::detail::require<ConfigError>(rules == "mpi" || rules == "nccl", "pmt::comm::nccl_matching_rules", [&] {
      return "PMT_COMM_RULES=" + rules +
             "; expected mpi (MPI's tag matching, the default) or nccl (NCCL's: issue "
             "order per pair, exact counts)";
    });
    return rules == "nccl";
  }();
  return on;
}

// ---------------------------------------------------------------------------------------------

/// \brief MPI communicator over a duplicate of an MPI_Comm (see the file comment).
/// \code
/// pmt::comm::Communicator<pmt::comm::Mpi> world(MPI_COMM_WORLD);
/// pmt::comm::all_reduce(world, exec, grads, pmt::comm::ReduceOp::Avg);
/// \endcode
/// \throws pmt::CommError when MPI fails.
template <>
class Communicator<Mpi> {
 public:
  using backend = Mpi;

  /// \brief Duplicates `comm` (collective over its ranks) and sets MPI_ERRORS_RETURN on the copy.
  explicit Communicator(MPI_Comm comm) {
    MPI_Comm dup = MPI_COMM_NULL;
    int r = 0, n = 1;
    MPI_Comm_rank(comm, &r);
    MPI_Comm_size(comm, &n);
    detail::check_mpi(MPI_Comm_dup(comm, &dup), "Communicator", "MPI_Comm_dup", r, n);
    adopt(dup);
  }

  int rank() const noexcept { return m_state->rank; }
  int size() const noexcept { return m_state->size; }
  MPI_Comm native() const noexcept { return m_state->comm; }
  bool debug() const noexcept { return m_state->debug.enabled; }
  void set_debug(bool on) const noexcept { m_state->debug.enabled = on; }
  std::uint64_t next_sequence() const noexcept { return m_state->debug.next++; }
  std::string name() const { return "pmt::comm::Communicator<Mpi>"; }

  /// \brief Whether point-to-point operations are ordered as on one CUDA stream (NCCL's rules,
  /// see the file comment): callers then issue a send with the receive it pairs with in a group.
  template <class Exec>
  bool stream_ordered() const noexcept {
    return nccl_matching_rules();
  }
  /// \brief Opens a group (nested groups count): see the file comment.
  void group_start() const noexcept { ++m_state->group_depth; }
  /// \brief Closes a group after an error without waiting for its operations (their Requests
  /// abandon them while the error unwinds).
  void group_cancel() const noexcept {
    if (m_state->group_depth > 0 && --m_state->group_depth == 0) m_state->grouped.clear();
  }
  /// \brief Closes a group; the outermost close completes its operations under NCCL's rules.
  /// \throws pmt::CommError from an operation of the group (all are completed or abandoned).
  template <class Exec>
  void group_end(const Exec& /*exec*/) const {
    detail::require<CommError>(m_state->group_depth > 0, "pmt::comm::group_end",
                               [] { return std::string("no group is open (group_start first)"); });
    if (--m_state->group_depth > 0) return;
    auto ops = std::move(m_state->grouped);
    m_state->grouped.clear();
    for (auto& o : ops) complete(*o, true, rank(), size());
  }

  /// \brief Ranks with the same color form a new communicator, ordered by key (MPI_Comm_split).
  Communicator split(int color, int key) const {
    MPI_Comm out = MPI_COMM_NULL;
    check(MPI_Comm_split(native(), color, key, &out), "split", "MPI_Comm_split");
    Communicator c;
    c.adopt(out);
    c.set_debug(debug());
    return c;
  }

  void barrier() const { check(MPI_Barrier(native()), "barrier", "MPI_Barrier"); }

  template <class Exec>
  void all_reduce_raw(const Exec& exec, const void* send, void* recv, std::size_t count, DataType t,
                      ReduceOp op) const {
    detail::static_check_mpi_space<Exec>();
    exec.fence();
    check(MPI_Allreduce(send == recv ? MPI_IN_PLACE : send, recv, icount(count), detail::mpi_type(t),
                        detail::mpi_op(op, t), native()),
          "all_reduce", "MPI_Allreduce");
  }

  /// In place (recv == send + rank * recv_count): MPI's in-place form leaves the result at the
  /// start of the buffer, so it is moved to this rank's block afterwards. Sums of float or double
  /// in host memory over 3 ranks or more and 4 MiB or more take pmt's ring instead (ring_sum_scatter):
  /// Open MPI 4.1's reduce-scatter algorithms took 1.3-5x the ring's time there (bench_allreduce),
  /// and about twice an all-reduce of the same buffer; with 2 ranks, or below 4 MiB, MPI's is as
  /// fast or faster.
  template <class Exec>
  void reduce_scatter_raw(const Exec& exec, const void* send, void* recv, std::size_t recv_count, DataType t,
                          ReduceOp op) const {
    detail::static_check_mpi_space<Exec>();
    exec.fence();
    const std::size_t bytes = recv_count * size_of(t);
    if constexpr (Kokkos::SpaceAccessibility<Kokkos::DefaultHostExecutionSpace,
                                             typename Exec::memory_space>::accessible)
      if (size() >= 3 && bytes * static_cast<std::size_t>(size()) >= (std::size_t(4) << 20) &&
          (op == ReduceOp::Sum || op == ReduceOp::Avg)) {  // Avg divides afterwards, as with MPI_SUM
        if (t == DataType::Float32)
          return ring_sum_scatter(static_cast<const float*>(send), static_cast<float*>(recv), recv_count, MPI_FLOAT);
        if (t == DataType::Float64)
          return ring_sum_scatter(static_cast<const double*>(send), static_cast<double*>(recv), recv_count, MPI_DOUBLE);
      }
    const bool in_place =
        static_cast<const char*>(send) + static_cast<std::size_t>(rank()) * bytes == static_cast<const char*>(recv);
    if (in_place) {
      void* whole = const_cast<void*>(send);
      check(MPI_Reduce_scatter_block(MPI_IN_PLACE, whole, icount(recv_count), detail::mpi_type(t),
                                     detail::mpi_op(op, t), native()),
            "reduce_scatter", "MPI_Reduce_scatter_block");
      if (rank() != 0 && bytes > 0) std::memcpy(recv, whole, bytes);  // host memory (MPI path)
    } else {
      check(MPI_Reduce_scatter_block(send, recv, icount(recv_count), detail::mpi_type(t), detail::mpi_op(op, t),
                                     native()),
            "reduce_scatter", "MPI_Reduce_scatter_block");
    }
  }

  template <class Exec>
  void all_gather_raw(const Exec& exec, const void* send, void* recv, std::size_t send_count, DataType t) const {
    detail::static_check_mpi_space<Exec>();
    exec.fence();
    const bool in_place = static_cast<const char*>(recv) + static_cast<std::size_t>(rank()) * send_count * size_of(t) ==
                          static_cast<const char*>(send);
    check(MPI_Allgather(in_place ? MPI_IN_PLACE : send, icount(send_count), detail::mpi_type(t), recv,
                        icount(send_count), detail::mpi_type(t), native()),
          "all_gather", "MPI_Allgather");
  }

  template <class Exec>
  void broadcast_raw(const Exec& exec, void* buf, std::size_t count, DataType t, int root) const {
    detail::static_check_mpi_space<Exec>();
    exec.fence();
    check(MPI_Bcast(buf, icount(count), detail::mpi_type(t), root, native()), "broadcast", "MPI_Bcast");
  }

  template <class Exec>
  void send_raw(const Exec& exec, const void* buf, std::size_t count, DataType t, int peer, int tag) const {
    detail::static_check_mpi_space<Exec>();
    exec.fence();
    refuse_in_group("send");
    if (nccl_matching_rules())  // a ncclSend outside a group holds the stream until its receiver takes it
      check(MPI_Ssend(buf, icount(count), detail::mpi_type(t), peer, p2p_tag(tag), native()), "send", "MPI_Ssend");
    else
      check(MPI_Send(buf, icount(count), detail::mpi_type(t), peer, p2p_tag(tag), native()), "send", "MPI_Send");
  }

  template <class Exec>
  void recv_raw(const Exec& exec, void* buf, std::size_t count, DataType t, int peer, int tag) const {
    detail::static_check_mpi_space<Exec>();
    exec.fence();
    refuse_in_group("recv");
    MPI_Status status{};
    check(MPI_Recv(buf, icount(count), detail::mpi_type(t), peer, p2p_tag(tag), native(), &status), "recv", "MPI_Recv");
    check_count(status, count, t, peer, "recv");
  }

  template <class Exec>
  Request iall_reduce_raw(const Exec& exec, const void* send, void* recv, std::size_t count, DataType t, ReduceOp op,
                          std::shared_ptr<void> keep, std::function<void()> on_complete) const {
    detail::static_check_mpi_space<Exec>();
    exec.fence();
    auto o = operation("iall_reduce");
    check(MPI_Iallreduce(send == recv ? MPI_IN_PLACE : send, recv, icount(count), detail::mpi_type(t),
                         detail::mpi_op(op, t), native(), &o->request),
          "iall_reduce", "MPI_Iallreduce");
    return issued(o, std::move(keep), std::move(on_complete));
  }

  /// Non-blocking MPI_Reduce_scatter_block (out of place).
  template <class Exec>
  Request ireduce_scatter_raw(const Exec& exec, const void* send, void* recv, std::size_t recv_count, DataType t,
                              ReduceOp op, std::shared_ptr<void> keep) const {
    detail::static_check_mpi_space<Exec>();
    exec.fence();
    auto o = operation("ireduce_scatter");
    check(MPI_Ireduce_scatter_block(send, recv, icount(recv_count), detail::mpi_type(t), detail::mpi_op(op, t),
                                    native(), &o->request),
          "ireduce_scatter", "MPI_Ireduce_scatter_block");
    return issued(o, std::move(keep), {});
  }

  /// Non-blocking MPI_Allgather (out of place).
  template <class Exec>
  Request iall_gather_raw(const Exec& exec, const void* send, void* recv, std::size_t send_count, DataType t,
                          std::shared_ptr<void> keep) const {
    detail::static_check_mpi_space<Exec>();
    exec.fence();
    auto o = operation("iall_gather");
    check(MPI_Iallgather(send, icount(send_count), detail::mpi_type(t), recv, icount(send_count), detail::mpi_type(t),
                         native(), &o->request),
          "iall_gather", "MPI_Iallgather");
    return issued(o, std::move(keep), {});
  }

  template <class Exec>
  Request isend_raw(const Exec& exec, const void* buf, std::size_t count, DataType t, int peer, int tag,
                    std::shared_ptr<void> keep) const {
    detail::static_check_mpi_space<Exec>();
    exec.fence();
    auto o = operation("isend");
    if (nccl_matching_rules())  // synchronous: complete once the receiver took it (see the file comment)
      check(MPI_Issend(buf, icount(count), detail::mpi_type(t), peer, p2p_tag(tag), native(), &o->request), "isend",
            "MPI_Issend");
    else
      check(MPI_Isend(buf, icount(count), detail::mpi_type(t), peer, p2p_tag(tag), native(), &o->request), "isend",
            "MPI_Isend");
    return issued(o, std::move(keep), {});
  }

  template <class Exec>
  Request irecv_raw(const Exec& exec, void* buf, std::size_t count, DataType t, int peer, int tag,
                    std::shared_ptr<void> keep) const {
    detail::static_check_mpi_space<Exec>();
    exec.fence();
    auto o      = operation("irecv");
    o->expected = Expected{count, t, peer};
    check(MPI_Irecv(buf, icount(count), detail::mpi_type(t), peer, p2p_tag(tag), native(), &o->request), "irecv",
          "MPI_Irecv");
    return issued(o, std::move(keep), {});
  }

  std::vector<detail::Fingerprint> gather_fingerprints(const detail::Fingerprint& f) const {
    std::vector<detail::Fingerprint> all(static_cast<std::size_t>(size()));
    check(MPI_Allgather(&f, sizeof f, MPI_BYTE, all.data(), sizeof f, MPI_BYTE, native()), "debug_fingerprint",
          "MPI_Allgather");
    return all;
  }

 private:
  /// The tag of ring_sum_scatter's messages (pmt's own p2p uses small tags).
  static constexpr int ring_tag = 32760;

  /// Reduce-scatter (sum) of n blocks of b values over a ring of the n ranks: in step k rank r
  /// passes its partial sum of block (r - k - 1) mod n to rank r + 1 and adds its own values of
  /// block (r - k - 2) mod n to the partial sum it receives from rank r - 1; after n - 1 steps it
  /// holds the whole sum of block r. Each rank sends (n - 1) b values, as in the first half of a
  /// ring all-reduce, and holds two blocks of scratch. Block j's values are added in the fixed
  /// order of ranks j + 1, j + 2, ..., j (deterministic). `recv` may be send + rank * b.
  template <class T>
  void ring_sum_scatter(const T* send, T* recv, std::size_t b, MPI_Datatype type) const {
    const int n = size(), r = rank();
    std::vector<T> cur(send + std::size_t((r + n - 1) % n) * b, send + std::size_t((r + n - 1) % n) * b + b), in(b);
    for (int k = 0; k < n - 1; ++k) {
      check(MPI_Sendrecv(cur.data(), icount(b), type, (r + 1) % n, ring_tag, in.data(), icount(b), type,
                         (r + n - 1) % n, ring_tag, native(), MPI_STATUS_IGNORE),
            "reduce_scatter", "MPI_Sendrecv");
      const T* own = send + std::size_t(((r - k - 2) % n + n) % n) * b;
      T* out       = k == n - 2 ? recv : cur.data();  // the last sum is this rank's block
      for (std::size_t i = 0; i < b; ++i) out[i] = in[i] + own[i];
    }
  }

  struct State {
    MPI_Comm comm = MPI_COMM_NULL;
    int rank = 0, size = 1;
    detail::CommDebugState debug;
    int group_depth = 0;
    std::vector<std::shared_ptr<detail::MpiOperation>> grouped;  // NCCL's rules: completed at the group's end
    ~State() {
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (!finalized && comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
    }
  };

  Communicator() = default;

  void adopt(MPI_Comm c) {
    m_state       = std::make_shared<State>();
    m_state->comm = c;
    MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
    MPI_Comm_rank(c, &m_state->rank);
    MPI_Comm_size(c, &m_state->size);
  }

  void check(int code, const char* op, const char* call) const { detail::check_mpi(code, op, call, rank(), size()); }

  int icount(std::size_t count) const {
    detail::require<CommError>(
        count <= static_cast<std::size_t>(std::numeric_limits<int>::max()), "pmt::comm::Mpi",
        [&] { return detail::str("a message of ", count, " elements exceeds MPI's int count; split it"); });
    return static_cast<int>(count);
  }

  using Expected  = detail::PostedReceive;
  using Operation = detail::MpiOperation;
  std::shared_ptr<Operation> operation(const char* op) const {
    auto o = std::make_shared<Operation>();
    o->op  = op;
    return o;
  }
  /// A posted operation's Request. Under NCCL's rules it completes here (outside a group: the
  /// stream's order) or at its group's end; outside them MPI progresses it until waited for.
  Request issued(const std::shared_ptr<Operation>& o, std::shared_ptr<void> keep,
                 std::function<void()> on_complete) const {
    if (nccl_matching_rules()) {
      if (m_state->group_depth > 0)
        m_state->grouped.push_back(o);
      else
        complete(*o, true, rank(), size());
    }
    const int r = rank(), n = size();
    return Request([o, r, n](bool block) { return complete(*o, block, r, n); }, std::move(keep),
                   std::move(on_complete));
  }
  /// Completes (block) or polls an operation once; its receive count is checked on completion.
  static bool complete(Operation& o, bool block, int r, int n) {
    if (o.done) return true;
    int done = 0;
    MPI_Status status{};
    if (block) {
      detail::check_mpi(MPI_Wait(&o.request, &status), o.op, "MPI_Wait", r, n);
      done = 1;
    } else {
      detail::check_mpi(MPI_Test(&o.request, &done, &status), o.op, "MPI_Test", r, n);
    }
    if (done == 0) return false;
    o.done = true;
    if (o.expected.peer >= 0) check_count(status, o.expected.count, o.expected.type, o.expected.peer, o.op, r, n);
    return true;
  }
  void refuse_in_group(const char* op) const {
    detail::require<CommError>(m_state->group_depth == 0, pmt::detail::str("pmt::comm::", op).c_str(), [] {
      return std::string(
          "a blocking operation inside a group (comm::group) would wait before the group is posted; "
          "use the non-blocking form");
    });
  }
  /// The tag a point-to-point message travels with: its own (MPI's rules) or one for all (NCCL's).
  static int p2p_tag(int tag) { return nccl_matching_rules() ? 0 : tag; }
  void check_count(const MPI_Status& status, std::size_t count, DataType t, int peer, const char* op) const {
    check_count(status, count, t, peer, op, rank(), size());
  }
  /// Under NCCL's rules: the message must hold exactly the count posted.
  static void check_count(const MPI_Status& status, std::size_t count, DataType t, int peer, const char* op, int r,
                          int n) {
    if (!nccl_matching_rules()) return;
    int got = 0;
    MPI_Get_count(&status, detail::mpi_type(t), &got);
    if (static_cast<std::size_t>(got) != count)
      throw CommError(pmt::detail::str("pmt::comm::", op),
                      pmt::detail::str("a message of ", got, " elements from rank ", peer, " matched a receive of ",
                                       count, " on rank ", r, " of ", n,
                                       " (NCCL's rules, PMT_COMM_RULES=nccl: messages between a pair match in issue "
                                       "order, whatever their tags: the two ranks issue them in different orders)"));
  }

  std::shared_ptr<State> m_state;
};

}  // namespace pmt::comm
#endif  // PMT_ENABLE_MPI
