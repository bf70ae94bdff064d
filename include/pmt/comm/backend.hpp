// SPDX-License-Identifier: Apache-2.0
#pragma once
// Communication backends as tag types (Self, Mpi, Nccl), the reductions collectives offer, and
// the element types they move. A backend is a Communicator<Backend> specialization; policy and
// layer headers include only this header, never <mpi.h> or <nccl.h>.

#include "pmt/config.hpp"
#include "pmt/core/bf16.hpp"
#include "pmt/core/tensor.hpp"

#include <cstdint>
#include <type_traits>

namespace pmt::comm {

/// \brief One rank, no transport: collectives are copies or nothing (serial builds, tests).
struct Self {};
/// \brief MPI on host memory (or CUDA-aware MPI on device memory when the build says so).
struct Mpi {};
/// \brief NCCL: one rank per GPU, collectives enqueued on the Kokkos::Cuda instance's stream.
struct Nccl {};

/// \brief The backend layers use by default on Exec: MPI (or Self without MPI) on host spaces,
/// NCCL (or Self) on device spaces.
template <class Exec>
using default_backend_t = std::conditional_t<is_host_space_v<Exec>, std::conditional_t<PMT_ENABLE_MPI != 0, Mpi, Self>,
                                             std::conditional_t<PMT_ENABLE_NCCL != 0, Nccl, Self>>;

/// \brief True for the backends pmt provides (Self, Mpi, Nccl).
template <class B>
inline constexpr bool is_comm_backend_v = std::is_same_v<B, Self> || std::is_same_v<B, Mpi> || std::is_same_v<B, Nccl>;

/// \brief The reduction of a collective. Avg = Sum divided by the communicator size
/// (floating-point types only).
enum class ReduceOp { Sum, Avg, Max, Min };

/// \brief "sum", "avg", "max" or "min".
inline constexpr const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return "sum";
    case ReduceOp::Avg:
      return "avg";
    case ReduceOp::Max:
      return "max";
    case ReduceOp::Min:
      return "min";
  }
  return "?";
}

/// \brief Element types collectives move.
/// BFloat16 (pmt::bf16) moves 16-bit floats; its Sum, Max and Min work in float per pair of
/// values and round back to bf16 (each hop of a reduction rounds once).
enum class DataType { Int8, UInt8, Int32, UInt32, Int64, UInt64, Float32, Float64, BFloat16 };

/// \brief The DataType of T (float, double, pmt::bf16, 8/32/64-bit integers; another type does not
/// compile).
template <class T>
constexpr DataType data_type_of() {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, float>)
    return DataType::Float32;
  else if constexpr (std::is_same_v<U, double>)
    return DataType::Float64;
  else if constexpr (std::is_same_v<U, bf16>)
    return DataType::BFloat16;
  else if constexpr (std::is_integral_v<U> && std::is_signed_v<U> && sizeof(U) == 1)
    return DataType::Int8;
  else if constexpr (std::is_integral_v<U> && std::is_unsigned_v<U> && sizeof(U) == 1)
    return DataType::UInt8;
  else if constexpr (std::is_integral_v<U> && std::is_signed_v<U> && sizeof(U) == 4)
    return DataType::Int32;
  else if constexpr (std::is_integral_v<U> && std::is_unsigned_v<U> && sizeof(U) == 4)
    return DataType::UInt32;
  else if constexpr (std::is_integral_v<U> && std::is_signed_v<U> && sizeof(U) == 8)
    return DataType::Int64;
  else if constexpr (std::is_integral_v<U> && std::is_unsigned_v<U> && sizeof(U) == 8)
    return DataType::UInt64;
  else
    static_assert(sizeof(U) == 0, "pmt::comm: collectives move float, double, pmt::bf16 and 8/32/64-bit integers");
}

/// \brief Bytes per element of t.
inline constexpr std::size_t size_of(DataType t) {
  switch (t) {
    case DataType::Int8:
    case DataType::UInt8:
      return 1;
    case DataType::BFloat16:
      return 2;
    case DataType::Int32:
    case DataType::UInt32:
    case DataType::Float32:
      return 4;
    case DataType::Int64:
    case DataType::UInt64:
    case DataType::Float64:
      return 8;
  }
  return 0;
}

/// \brief "int8" ... "float64", "bfloat16".
inline constexpr const char* to_string(DataType t) {
  switch (t) {
    case DataType::Int8:
      return "int8";
    case DataType::UInt8:
      return "uint8";
    case DataType::Int32:
      return "int32";
    case DataType::UInt32:
      return "uint32";
    case DataType::Int64:
      return "int64";
    case DataType::UInt64:
      return "uint64";
    case DataType::Float32:
      return "float32";
    case DataType::Float64:
      return "float64";
    case DataType::BFloat16:
      return "bfloat16";
  }
  return "?";
}

}  // namespace pmt::comm
