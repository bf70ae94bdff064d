// SPDX-License-Identifier: Apache-2.0
#pragma once
// The CUDA runtime on the host side, for builds with CUDA (PMT_ENABLE_CUDA): what the
// environment report says of the devices, and the current device's name and peak (for MFU). The kernels reach CUDA
// through Kokkos; cuBLAS is in ops/detail/matmul_cublas.hpp and NCCL in comm/nccl.hpp.

#include "pmt/config.hpp"

#if PMT_ENABLE_CUDA
#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

namespace pmt::detail {

/// "N device(s)", or why the runtime sees none.
inline std::string cuda_device_report() {
  int devices              = 0;
  const cudaError_t status = cudaGetDeviceCount(&devices);
  if (status == cudaSuccess) return std::to_string(devices) + " device(s)";
  return std::string("runtime linked, no usable device: ") + cudaGetErrorString(status);
}

/// The current device's free memory in bytes (cudaMemGetInfo), 0 when no device answers.
inline double cuda_device_free_bytes() {
  std::size_t free = 0, total = 0;
  return cudaMemGetInfo(&free, &total) == cudaSuccess ? double(free) : 0.0;
}

/// The current device's name, "device D: NAME", or why there is none.
inline std::string cuda_device_name() {
  int d = 0;
  cudaDeviceProp p{};
  if (cudaGetDevice(&d) != cudaSuccess || cudaGetDeviceProperties(&p, d) != cudaSuccess) return "no CUDA device";
  return "device " + std::to_string(d) + ": " + p.name;
}

/// The current device's peak in GFLOP/s: its multiprocessors x its boost clock x the FLOPs one
/// multiprocessor of its compute capability issues per clock, fp32 FMA lanes (`bf16` false) or
/// dense bf16 tensor-core products with fp32 sums (`bf16` true; 0 where the capability has no
/// bf16 tensor cores). 0 when no device answers or the capability is unknown.
inline double cuda_device_peak_gflops(bool bf16) {
  int d = 0, sms = 0, khz = 0, major = 0, minor = 0;
  if (cudaGetDevice(&d) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, d) != cudaSuccess ||
      cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, d) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, d) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, d) != cudaSuccess)
    return 0;
  const int cc     = 10 * major + minor;
  double per_clock = 0;  // FLOPs per multiprocessor per clock
  if (!bf16)
    per_clock = cc >= 86 ? 256 : cc >= 60 ? 128 : 0;  // 2 x FP32 lanes
  else
    per_clock = cc >= 100 ? 8192 : cc == 90 ? 4096 : cc == 80 ? 2048 : cc >= 86 ? 1024 : 0;
  return double(sms) * double(khz) * 1e3 * per_clock / 1e9;
}

}  // namespace pmt::detail
#endif  // PMT_ENABLE_CUDA
