// SPDX-License-Identifier: Apache-2.0
#pragma once
// Communicator<Nccl>: one rank per GPU. The NCCL unique id is created on rank 0 and broadcast over
// the MPI communicator the NCCL one is built from; that MPI communicator also carries debug-mode
// fingerprints. Collectives are enqueued on the CUDA stream of the Kokkos::Cuda instance passed
// to them (no host synchronisation). Errors: ncclGetErrorString plus ncclGetLastError, as
// pmt::CommError. synchronize() waits for a stream while polling ncclCommGetAsyncError, and on
// an asynchronous error or after the timeout aborts the NCCL communicator and raises, instead of
// hanging. A communicator released after this rank failed (core/failure.hpp) is aborted
// (ncclCommAbort), not destroyed: ncclCommDestroy would wait for operations whose peers never
// come. Called with a host execution space (host values: a loss, agreed errors, checkpoint
// metadata), an operation runs over that bootstrap MPI communicator instead, since NCCL reads
// device memory only; the two never share a buffer, so their orders do not interact.
// Host-compiled against the CUDA toolkit's headers; runs where a CUDA device exists.

#include "pmt/config.hpp"

#if PMT_ENABLE_NCCL && PMT_ENABLE_MPI
#include "pmt/comm/backend.hpp"
#include "pmt/comm/communicator.hpp"
#include "pmt/comm/mpi.hpp"
#include "pmt/comm/request.hpp"
#include "pmt/core/error.hpp"
#include "pmt/core/failure.hpp"
#include "pmt/core/tensor.hpp"

#include <Kokkos_Core.hpp>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace pmt::detail {

inline ncclDataType_t nccl_type(comm::DataType t) {
  switch (t) {
    case comm::DataType::Int8:
      return ncclInt8;
    case comm::DataType::UInt8:
      return ncclUint8;
    case comm::DataType::Int32:
      return ncclInt32;
    case comm::DataType::UInt32:
      return ncclUint32;
    case comm::DataType::Int64:
      return ncclInt64;
    case comm::DataType::UInt64:
      return ncclUint64;
    case comm::DataType::Float32:
      return ncclFloat32;
    case comm::DataType::Float64:
      return ncclFloat64;
    case comm::DataType::BFloat16:
      return ncclBfloat16;
  }
  return ncclFloat32;
}

inline ncclRedOp_t nccl_op(comm::ReduceOp op) {
  switch (op) {
    case comm::ReduceOp::Sum:
    case comm::ReduceOp::Avg:
      return ncclSum;  // Avg divides afterwards, as on every backend
    case comm::ReduceOp::Max:
      return ncclMax;
    case comm::ReduceOp::Min:
      return ncclMin;
  }
  return ncclSum;
}

/// Throws CommError("pmt::comm::Nccl::<op>", "<call> failed: <NCCL text>: <last error>").
inline void check_nccl(ncclResult_t code, const char* op, const char* call, ncclComm_t comm = nullptr) {
  if (code == ncclSuccess || code == ncclInProgress) return;
  const char* last = ncclGetLastError(comm);
  throw CommError(str("pmt::comm::Nccl::", op),
                  str(call, " failed: ", ncclGetErrorString(code), (last && *last ? std::string(": ") + last : "")));
}

inline void check_cuda(cudaError_t code, const char* op, const char* call) {
  if (code == cudaSuccess) return;
  throw CommError(str("pmt::comm::Nccl::", op), str(call, " failed: ", cudaGetErrorString(code)));
}

/// The CUDA stream of an execution-space instance (Kokkos::Cuda only).
template <class Exec>
cudaStream_t cuda_stream_of(const Exec& exec) {
#if defined(KOKKOS_ENABLE_CUDA)
  if constexpr (std::is_same_v<Exec, Kokkos::Cuda>) {
    return exec.cuda_stream();
  } else
#endif
  {
    static_assert(dependent_false_v<Exec>,
                  "pmt::comm::Nccl: collectives need a Kokkos::Cuda execution-space instance (NCCL "
                  "enqueues on its stream); use Communicator<Mpi> for host spaces");
    (void)exec;
    return nullptr;
  }
}

/// Seconds synchronize() waits before aborting: $PMT_NCCL_TIMEOUT, default 300.
inline double nccl_timeout_seconds() {
  const char* env = std::getenv("PMT_NCCL_TIMEOUT");
  return env ? std::atof(env) : 300.0;
}

/// The linked NCCL's version, "2.21.5".
inline std::string nccl_version() {
  int v = 0;
  ncclGetVersion(&v);
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

}  // namespace pmt::detail

namespace pmt::comm {

// ---------------------------------------------------------------------------------------------

/// \brief NCCL communicator over the ranks of an MPI communicator, one GPU each.
/// \throws pmt::CommError when no CUDA device is usable, or NCCL fails.
template <>
class Communicator<Nccl> {
 public:
  using backend = Nccl;

  /// \brief Collective over `bootstrap`'s ranks. `device` >= 0 selects this rank's GPU first;
  /// otherwise the current device (the one Kokkos chose) is used.
  explicit Communicator(const Communicator<Mpi>& bootstrap, int device = -1)
      : m_state(std::make_shared<State>(bootstrap)) {
    int devices              = 0;
    const cudaError_t status = cudaGetDeviceCount(&devices);
    if (status != cudaSuccess || devices == 0)
      throw CommError("pmt::comm::Communicator<Nccl>",
                      detail::str("no CUDA device on rank ", bootstrap.rank(), ": cudaGetDeviceCount says ",
                                  status == cudaSuccess ? std::string("0 devices") : cudaGetErrorString(status),
                                  "; NCCL needs one GPU per rank"));
    if (device >= 0) detail::check_cuda(cudaSetDevice(device), "Communicator", "cudaSetDevice");
    ncclUniqueId id;
    if (bootstrap.rank() == 0) detail::check_nccl(ncclGetUniqueId(&id), "Communicator", "ncclGetUniqueId");
    detail::check_mpi(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, bootstrap.native()), "Communicator", "MPI_Bcast",
                      bootstrap.rank(), bootstrap.size());
    detail::check_nccl(ncclCommInitRank(&m_state->comm, bootstrap.size(), id, bootstrap.rank()), "Communicator",
                       "ncclCommInitRank");
  }

  int rank() const noexcept { return m_state->bootstrap.rank(); }
  int size() const noexcept { return m_state->bootstrap.size(); }
  ncclComm_t native() const noexcept { return m_state->comm; }
  bool debug() const noexcept { return m_state->bootstrap.debug(); }
  void set_debug(bool on) const noexcept { m_state->bootstrap.set_debug(on); }
  std::uint64_t next_sequence() const noexcept { return m_state->bootstrap.next_sequence(); }
  std::string name() const { return "pmt::comm::Communicator<Nccl>"; }

  /// \brief Device operations are kernels on one CUDA stream, in issue order (see
  /// comm/communicator.hpp); host ones go over the MPI bootstrap.
  template <class Exec>
  bool stream_ordered() const noexcept {
    if constexpr (is_host_space_v<Exec>)
      return m_state->bootstrap.template stream_ordered<Exec>();
    else
      return true;
  }
  /// \brief ncclGroupStart (and a group of the bootstrap, for host operations).
  void group_start() const {
    check(ncclGroupStart(), "group_start", "ncclGroupStart");
    m_state->bootstrap.group_start();
    ++m_state->group_depth;
  }
  /// \brief Closes a group after an error (ncclGroupEnd, its result ignored: the error raised is
  /// the one to report; a failed rank aborts the communicator).
  void group_cancel() const noexcept {
    if (m_state->group_depth > 0) {
      --m_state->group_depth;
      (void)ncclGroupEnd();
      if (m_state->group_depth == 0) m_state->group_events.clear();
    }
    m_state->bootstrap.group_cancel();
  }
  /// \brief ncclGroupEnd: the group's operations are enqueued together; the completion events of
  /// its non-blocking operations are recorded after them.
  template <class Exec>
  void group_end(const Exec& exec) const {
    --m_state->group_depth;
    check(ncclGroupEnd(), "group_end", "ncclGroupEnd");
    if (m_state->group_depth == 0) {
      auto events = std::move(m_state->group_events);
      m_state->group_events.clear();
      for (const auto& [ev, stream] : events)
        detail::check_cuda(cudaEventRecord(ev.get(), stream), "group_end", "cudaEventRecord");
    }
    m_state->bootstrap.group_end(exec);
  }

  /// \brief Ranks with the same color form a new NCCL communicator, ordered by key.
  Communicator split(int color, int key) const {
    Communicator out(m_state->bootstrap.split(color, key), nullptr);
    check(ncclCommSplit(native(), color, key, &out.m_state->comm, nullptr), "split", "ncclCommSplit");
    return out;
  }

  /// \brief Host barrier over the bootstrap MPI communicator (NCCL has none).
  void barrier() const { m_state->bootstrap.barrier(); }

  /// \brief Waits until `stream` is idle, polling NCCL's asynchronous error state; on an error or
  /// after the timeout (seconds, default $PMT_NCCL_TIMEOUT or 300) aborts the communicator and raises.
  void synchronize(cudaStream_t stream, double timeout_s = detail::nccl_timeout_seconds()) const {
    wait_until([stream] { return cudaStreamQuery(stream); }, timeout_s, "synchronize");
  }

  template <class Exec>
  void all_reduce_raw(const Exec& exec, const void* send, void* recv, std::size_t count, DataType t,
                      ReduceOp op) const {
    if constexpr (is_host_space_v<Exec>) {
      return m_state->bootstrap.all_reduce_raw(exec, send, recv, count, t, op);
    } else {
      check(ncclAllReduce(send, recv, count, detail::nccl_type(t), detail::nccl_op(op), native(),
                          detail::cuda_stream_of(exec)),
            "all_reduce", "ncclAllReduce");
    }
  }
  template <class Exec>
  void reduce_scatter_raw(const Exec& exec, const void* send, void* recv, std::size_t recv_count, DataType t,
                          ReduceOp op) const {
    if constexpr (is_host_space_v<Exec>) {
      return m_state->bootstrap.reduce_scatter_raw(exec, send, recv, recv_count, t, op);
    } else {
      check(ncclReduceScatter(send, recv, recv_count, detail::nccl_type(t), detail::nccl_op(op), native(),
                              detail::cuda_stream_of(exec)),
            "reduce_scatter", "ncclReduceScatter");
    }
  }
  template <class Exec>
  void all_gather_raw(const Exec& exec, const void* send, void* recv, std::size_t send_count, DataType t) const {
    if constexpr (is_host_space_v<Exec>) {
      return m_state->bootstrap.all_gather_raw(exec, send, recv, send_count, t);
    } else {
      check(ncclAllGather(send, recv, send_count, detail::nccl_type(t), native(), detail::cuda_stream_of(exec)),
            "all_gather", "ncclAllGather");
    }
  }
  template <class Exec>
  void broadcast_raw(const Exec& exec, void* buf, std::size_t count, DataType t, int root) const {
    if constexpr (is_host_space_v<Exec>) {
      return m_state->bootstrap.broadcast_raw(exec, buf, count, t, root);
    } else {
      check(ncclBroadcast(buf, buf, count, detail::nccl_type(t), root, native(), detail::cuda_stream_of(exec)),
            "broadcast", "ncclBroadcast");
    }
  }
  template <class Exec>
  void send_raw(const Exec& exec, const void* buf, std::size_t count, DataType t, int peer, int tag) const {
    if constexpr (is_host_space_v<Exec>) {
      return m_state->bootstrap.send_raw(exec, buf, count, t, peer, tag);
    } else {
      (void)tag;  // NCCL matches a pair's messages in issue order
      check(ncclSend(buf, count, detail::nccl_type(t), peer, native(), detail::cuda_stream_of(exec)), "send",
            "ncclSend");
    }
  }
  template <class Exec>
  void recv_raw(const Exec& exec, void* buf, std::size_t count, DataType t, int peer, int tag) const {
    if constexpr (is_host_space_v<Exec>) {
      return m_state->bootstrap.recv_raw(exec, buf, count, t, peer, tag);
    } else {
      (void)tag;
      check(ncclRecv(buf, count, detail::nccl_type(t), peer, native(), detail::cuda_stream_of(exec)), "recv",
            "ncclRecv");
    }
  }
  template <class Exec>
  Request iall_reduce_raw(const Exec& exec, const void* send, void* recv, std::size_t count, DataType t, ReduceOp op,
                          std::shared_ptr<void> keep, std::function<void()> on_complete) const {
    if constexpr (is_host_space_v<Exec>) {
      return m_state->bootstrap.iall_reduce_raw(exec, send, recv, count, t, op, std::move(keep),
                                                std::move(on_complete));
    } else {
      all_reduce_raw(exec, send, recv, count, t, op);
      return event_request(detail::cuda_stream_of(exec), "iall_reduce", std::move(keep), std::move(on_complete));
    }
  }
  template <class Exec>
  Request ireduce_scatter_raw(const Exec& exec, const void* send, void* recv, std::size_t recv_count, DataType t,
                              ReduceOp op, std::shared_ptr<void> keep) const {
    if constexpr (is_host_space_v<Exec>) {
      return m_state->bootstrap.ireduce_scatter_raw(exec, send, recv, recv_count, t, op, std::move(keep));
    } else {
      reduce_scatter_raw(exec, send, recv, recv_count, t, op);
      return event_request(detail::cuda_stream_of(exec), "ireduce_scatter", std::move(keep), {});
    }
  }
  template <class Exec>
  Request iall_gather_raw(const Exec& exec, const void* send, void* recv, std::size_t send_count, DataType t,
                          std::shared_ptr<void> keep) const {
    if constexpr (is_host_space_v<Exec>) {
      return m_state->bootstrap.iall_gather_raw(exec, send, recv, send_count, t, std::move(keep));
    } else {
      all_gather_raw(exec, send, recv, send_count, t);
      return event_request(detail::cuda_stream_of(exec), "iall_gather", std::move(keep), {});
    }
  }
  template <class Exec>
  Request isend_raw(const Exec& exec, const void* buf, std::size_t count, DataType t, int peer, int tag,
                    std::shared_ptr<void> keep) const {
    if constexpr (is_host_space_v<Exec>) {
      return m_state->bootstrap.isend_raw(exec, buf, count, t, peer, tag, std::move(keep));
    } else {
      send_raw(exec, buf, count, t, peer, tag);
      return event_request(detail::cuda_stream_of(exec), "isend", std::move(keep), {});
    }
  }
  template <class Exec>
  Request irecv_raw(const Exec& exec, void* buf, std::size_t count, DataType t, int peer, int tag,
                    std::shared_ptr<void> keep) const {
    if constexpr (is_host_space_v<Exec>) {
      return m_state->bootstrap.irecv_raw(exec, buf, count, t, peer, tag, std::move(keep));
    } else {
      recv_raw(exec, buf, count, t, peer, tag);
      return event_request(detail::cuda_stream_of(exec), "irecv", std::move(keep), {});
    }
  }
  std::vector<detail::Fingerprint> gather_fingerprints(const detail::Fingerprint& f) const {
    return m_state->bootstrap.gather_fingerprints(f);
  }

 private:
  struct State {
    explicit State(const Communicator<Mpi>& b) : bootstrap(b) {}
    ~State() {  // after a failure (core/failure.hpp) peers may never complete what is pending: abort
      if (comm && rank_failed())
        ncclCommAbort(comm);
      else if (comm)
        ncclCommDestroy(comm);
    }
    Communicator<Mpi> bootstrap;
    ncclComm_t comm = nullptr;
    int group_depth = 0;
    // events of a group's non-blocking operations, recorded at its end (after ncclGroupEnd)
    std::vector<std::pair<std::shared_ptr<CUevent_st>, cudaStream_t>> group_events;
  };

  Communicator(const Communicator<Mpi>& bootstrap, std::nullptr_t) : m_state(std::make_shared<State>(bootstrap)) {}

  void check(ncclResult_t code, const char* op, const char* call) const {
    detail::check_nccl(code, op, call, native());
  }

  /// Polls `query` (cudaSuccess = done, cudaErrorNotReady = pending) and NCCL's async error.
  template <class Query>
  void wait_until(Query query, double timeout_s, const char* op) const {
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
      const cudaError_t q = query();
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) detail::check_cuda(q, op, "cudaStreamQuery/cudaEventQuery");
      ncclResult_t async = ncclSuccess;
      check(ncclCommGetAsyncError(native(), &async), op, "ncclCommGetAsyncError");
      if (async != ncclSuccess && async != ncclInProgress) {
        ncclCommAbort(m_state->comm);
        m_state->comm = nullptr;
        detail::check_nccl(async, op, "asynchronous NCCL operation");
      }
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (waited > timeout_s) {
        ncclCommAbort(m_state->comm);
        m_state->comm = nullptr;
        throw CommError(detail::str("pmt::comm::Nccl::", op),
                        detail::str("no progress after ", timeout_s,
                                    " s (a rank may have skipped a collective); "
                                    "the NCCL communicator was aborted (communicator rank ",
                                    rank(), " of ", size(), ")"));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  Request event_request(cudaStream_t stream, const char* op, std::shared_ptr<void> keep,
                        std::function<void()> on_complete) const {
    cudaEvent_t ev = nullptr;
    detail::check_cuda(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), op, "cudaEventCreate");
    auto event = std::shared_ptr<CUevent_st>(ev, [](cudaEvent_t e) { cudaEventDestroy(e); });
    if (m_state->group_depth > 0)  // in a group: the operation is enqueued at ncclGroupEnd
      m_state->group_events.emplace_back(event, stream);
    else
      detail::check_cuda(cudaEventRecord(ev, stream), op, "cudaEventRecord");
    auto self = *this;
    return Request(
        [self, event, op](bool block) {
          if (!block) {
            const cudaError_t q = cudaEventQuery(event.get());
            if (q == cudaErrorNotReady) return false;
            detail::check_cuda(q, op, "cudaEventQuery");
            return true;
          }
          self.wait_until([event] { return cudaEventQuery(event.get()); }, detail::nccl_timeout_seconds(), op);
          return true;
        },
        std::move(keep), std::move(on_complete));
  }

  std::shared_ptr<State> m_state;
};

}  // namespace pmt::comm
#endif  // PMT_ENABLE_NCCL && PMT_ENABLE_MPI
