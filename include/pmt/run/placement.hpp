// SPDX-License-Identifier: Apache-2.0
#pragma once
// Where a program's ranks compute and how they talk: the --device and --comm flags of pmt's
// programs, as types. --device default (the default) runs on Kokkos::DefaultExecutionSpace
// (Kokkos::Cuda when Kokkos has CUDA, else OpenMP or Serial), --device host on
// Kokkos::DefaultHostExecutionSpace. --comm auto (the default) takes NCCL for GPU ranks when pmt
// is built with NCCL (else a CUDA-aware MPI where the build says it has one), MPI for host ranks,
// and Self without MPI; --comm mpi or nccl names one. A combination this build cannot run is a
// pmt::ConfigError that names what it can run, raised alike on every rank before anything starts.
//
// with_placement(device, comm, f) calls f(Type<Exec>{}, Type<Backend>{}) for the choice, so a
// program instantiates its run once per placement the build can take (two at most: the host and
// the device). communicator_for<Backend>(world) makes the run's communicator from the job's MPI
// (or Self) world: the world itself, or a Communicator<Nccl> over its ranks (collective). The
// program's own host values (a loss, agreed errors) keep travelling over the world. The peak MFU
// counts against on either space is obs::peak_gflops<Exec> (obs/peak.hpp).

#include "pmt/comm/backend.hpp"
#include "pmt/comm/communicator.hpp"
#include "pmt/config.hpp"
#include "pmt/core/error.hpp"
#include "pmt/detail/cuda_runtime.hpp"
#if PMT_ENABLE_MPI
#include "pmt/comm/mpi.hpp"
#endif
#if PMT_ENABLE_NCCL && PMT_ENABLE_MPI
#include "pmt/comm/nccl.hpp"
#endif

#include <Kokkos_Core.hpp>

#include <string>
#include <type_traits>
#include <utility>

namespace pmt::run {

/// \brief A type as a value (the arguments with_placement passes).
template <class T>
struct Type {
  using type = T;
};

/// \brief The name of an execution space, as Kokkos says it ("Cuda", "OpenMP", "Serial").
template <class Exec>
std::string space_name() {
  return Exec::name();
}

/// \brief True when Kokkos' default execution space is not a host space (a GPU build).
inline constexpr bool has_device_space = !is_host_space_v<Kokkos::DefaultExecutionSpace>;

namespace placement_detail {

constexpr bool nccl_built    = PMT_ENABLE_NCCL != 0 && PMT_ENABLE_MPI != 0;
constexpr bool mpi_on_device = PMT_ENABLE_MPI != 0 && PMT_CUDA_AWARE_MPI != 0;

/// The backend the flags pick on a device space: "nccl", "mpi", "self", or "" for none.
inline std::string device_backend(const std::string& comm) {
  if (comm == "nccl") return nccl_built ? "nccl" : "";
  if (comm == "mpi") return mpi_on_device ? "mpi" : "";
  return nccl_built ? "nccl" : mpi_on_device ? "mpi" : PMT_ENABLE_MPI ? "" : "self";
}

/// The backend on the host: "mpi", "self", or "" for none.
inline std::string host_backend(const std::string& comm) {
  if (comm == "nccl") return "";
  if (comm == "mpi") return PMT_ENABLE_MPI ? "mpi" : "";
  return PMT_ENABLE_MPI ? "mpi" : "self";
}

}  // namespace placement_detail

/// \brief Checks --device (host or default) and --comm (auto, mpi or nccl) against what this
/// build can run. \throws pmt::ConfigError(prog, ...) naming the build's spaces and backends.
inline void check_placement(const char* prog, const std::string& device, const std::string& comm) {
  using namespace placement_detail;
  if (device != "host" && device != "default")
    throw ConfigError(prog, "--device " + device + ": expected host or default");
  if (comm != "auto" && comm != "mpi" && comm != "nccl")
    throw ConfigError(prog, "--comm " + comm + ": expected auto, mpi or nccl");
  const bool on_device     = device == "default" && has_device_space;
  const std::string picked = on_device ? device_backend(comm) : host_backend(comm);
  if (!picked.empty()) return;
  const std::string where = on_device ? "GPU ranks (Kokkos::" + space_name<Kokkos::DefaultExecutionSpace>() + ")"
                                      : "host ranks (Kokkos::" + space_name<Kokkos::DefaultHostExecutionSpace>() + ")";
  std::string can         = on_device ? std::string(nccl_built ? "nccl" : "") +
                                    (mpi_on_device ? std::string(nccl_built ? ", " : "") + "mpi (CUDA-aware)" : "")
                                      : std::string(PMT_ENABLE_MPI ? "mpi" : "none (one rank, no MPI)");
  if (can.empty()) can = "none (build pmt with NCCL, or with PMT_CUDA_AWARE_MPI for a CUDA-aware MPI)";
  std::string hint;
  if (!on_device && comm == "nccl")
    hint = has_device_space ? "; NCCL moves device memory: --device default runs on the GPU"
                            : "; NCCL needs GPU ranks, and this build's Kokkos has no GPU backend";
  throw ConfigError(prog, "--comm " + comm + " cannot connect " + where + " in this build; it can: " + can + hint);
}

/// \brief Calls f(Type<Exec>{}, Type<Backend>{}) for --device and --comm (checked first, see
/// check_placement) and returns what f returns.
template <class F>
decltype(auto) with_placement(const char* prog, const std::string& device, const std::string& comm, F&& f) {
  using namespace placement_detail;
  check_placement(prog, device, comm);
  using Host = Kokkos::DefaultHostExecutionSpace;
  if constexpr (has_device_space) {
    using Dev = Kokkos::DefaultExecutionSpace;
    if (device == "default") {
      const std::string b = device_backend(comm);
      if constexpr (nccl_built)
        if (b == "nccl") return f(Type<Dev>{}, Type<comm::Nccl>{});
      if constexpr (mpi_on_device)
        if (b == "mpi") return f(Type<Dev>{}, Type<comm::Mpi>{});
      if constexpr (!PMT_ENABLE_MPI) return f(Type<Dev>{}, Type<comm::Self>{});
    }
  }
  return f(Type<Host>{}, Type<comm::default_backend_t<Host>>{});
}

/// \brief The run's communicator over the ranks of `world` (the job's MPI or Self communicator):
/// `world` itself for its own backend, a new Communicator<Nccl> over its ranks (collective; each
/// rank on the GPU Kokkos took) for NCCL.
template <class B, class W>
comm::Communicator<B> communicator_for(const W& world) {
  if constexpr (std::is_same_v<comm::Communicator<B>, W>)
    return world;
  else
    return comm::Communicator<B>(world);
}

/// \brief "4 thread(s) per rank on Kokkos::OpenMP, MPI" or "one GPU per rank on Kokkos::Cuda
/// (device 0: NAME), NCCL".
template <class Exec, class Backend>
std::string placement_description() {
  const std::string comm = std::is_same_v<Backend, comm::Nccl>  ? "NCCL"
                           : std::is_same_v<Backend, comm::Mpi> ? "MPI"
                                                                : "one rank";
  if constexpr (is_host_space_v<Exec>) {
    return std::to_string(Exec().concurrency()) + " thread(s) per rank on Kokkos::" + space_name<Exec>() + ", " + comm;
  } else {
#if PMT_ENABLE_CUDA
    const std::string which = " (" + pmt::detail::cuda_device_name() + ")";
#else
    const std::string which;
#endif
    return "one GPU per rank on Kokkos::" + space_name<Exec>() + which + ", " + comm;
  }
}

}  // namespace pmt::run
