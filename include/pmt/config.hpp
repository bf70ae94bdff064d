// SPDX-License-Identifier: Apache-2.0
#pragma once
// Backend switches. CMake's pmt::pmt target defines each PMT_ENABLE_* it found (1) and leaves the
// rest undefined; this header turns every undefined switch into 0 so code can use `#if`.
//   PMT_ENABLE_MPI    Open MPI / MPICH through <mpi.h>          (comm::Mpi, ScopeGuard's MPI_Init)
//   PMT_ENABLE_CBLAS  a CBLAS (OpenBLAS; or MKL, ...) <cblas.h> (vendor matmul on host memory)
//   PMT_ENABLE_CUDA   CUDA runtime + cuBLAS                     (vendor matmul on Kokkos::Cuda)
//   PMT_ENABLE_NCCL   NCCL                                      (comm::Nccl)

#ifndef PMT_ENABLE_MPI
#define PMT_ENABLE_MPI 0
#endif
#ifndef PMT_ENABLE_CBLAS
#define PMT_ENABLE_CBLAS 0
#endif
#ifndef PMT_HAVE_OPENBLAS_INFO
#define PMT_HAVE_OPENBLAS_INFO 0
#endif
#ifndef PMT_CBLAS_MKL  // the CBLAS is Intel MKL's (<mkl_cblas.h>); see pmt/detail/cblas.hpp
#define PMT_CBLAS_MKL 0
#endif
#ifndef PMT_ENABLE_CUDA
#define PMT_ENABLE_CUDA 0
#endif
#ifndef PMT_ENABLE_NCCL
#define PMT_ENABLE_NCCL 0
#endif
#ifndef PMT_DEBUG
#define PMT_DEBUG 0
#endif
// PMT_CUDA_AWARE_MPI  the MPI library accepts device pointers (set by CMake's
//                     PMT_CUDA_AWARE_MPI option; pmt cannot detect it reliably)
#ifndef PMT_CUDA_AWARE_MPI
#define PMT_CUDA_AWARE_MPI 0
#endif
