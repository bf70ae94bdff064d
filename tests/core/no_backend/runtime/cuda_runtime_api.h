// SPDX-License-Identifier: Apache-2.0
// Stands in for <cuda_runtime_api.h> while core/ and policy/ are compiled by a compiler other than nvcc
// (tests/CMakeLists.txt; nvcc includes the runtime in every translation unit itself): any include
// of it is a layering error, since those layers need no communication or device backend.
#error \
    "pmt: a core/ or policy/ header includes <cuda_runtime_api.h>; backends are included only by the headers that implement them"
