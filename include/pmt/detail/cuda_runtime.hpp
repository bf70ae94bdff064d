// SPDX-License-Identifier: Apache-2.0
#pragma once
// The CUDA runtime on the host side, for builds with CUDA (PMT_ENABLE_CUDA): what the
// environment report says of the devices. The kernels reach CUDA through Kokkos; cuBLAS is in
// ops/detail/matmul_cublas.hpp and NCCL in comm/nccl.hpp.

#include "pmt/config.hpp"

#if PMT_ENABLE_CUDA
#include <cuda_runtime_api.h>

#include <string>

namespace pmt::detail {

/// "N device(s)", or why the runtime sees none.
inline std::string cuda_device_report() {
  int devices              = 0;
  const cudaError_t status = cudaGetDeviceCount(&devices);
  if (status == cudaSuccess) return std::to_string(devices) + " device(s)";
  return std::string("runtime linked, no usable device: ") + cudaGetErrorString(status);
}

}  // namespace pmt::detail
#endif  // PMT_ENABLE_CUDA
