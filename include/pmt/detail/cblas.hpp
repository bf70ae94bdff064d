// SPDX-License-Identifier: Apache-2.0
#pragma once
// The CBLAS header of the BLAS this build links: <cblas.h> (OpenBLAS, BLIS, AOCL, the reference
// CBLAS), or Intel MKL's <mkl_cblas.h> where CMake found only that (PMT_CBLAS_MKL=1, set when
// PMT_CBLAS_LIBRARIES_USER names MKL's libraries; docs/ops.md "Which BLAS"). Nothing when the
// build has no CBLAS.

#include "pmt/config.hpp"

#if PMT_ENABLE_CBLAS
#if PMT_CBLAS_MKL
#include <mkl_cblas.h>
#include <mkl_service.h>
#else
#include <cblas.h>
#endif
#endif
