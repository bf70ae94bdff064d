# SPDX-License-Identifier: Apache-2.0
# Finds pmt's optional backends and creates the imported targets pmt links against. Used twice:
# by pmt's own build (PMT_ENABLE_<X> = ON, OFF or AUTO) and by the installed pmtConfig.cmake
# (PMT_ENABLE_<X> = what the installed build had, then required).
#
#   MPI    -> MPI::MPI_CXX                         PMT_ENABLE_MPI=1
#   CBLAS  -> pmt_deps::cblas (BLAS + cblas.h)     PMT_ENABLE_CBLAS=1 (+ PMT_HAVE_OPENBLAS_INFO);
#             Debian's OpenMP-threaded OpenBLAS preferred (PMT_PREFER_OPENMP_BLAS), or the
#             libraries in PMT_CBLAS_LIBRARIES_USER with the header in PMT_CBLAS_INCLUDE_DIR
#             (any CBLAS; MKL's mkl_cblas.h -> PMT_CBLAS_MKL=1)
#   CUDA   -> CUDA::cudart, CUDA::cublas           PMT_ENABLE_CUDA=1 (AUTO: only with Kokkos' CUDA backend)
#   NCCL   -> pmt_deps::nccl (under the CUDA toolkit) PMT_ENABLE_NCCL=1 (needs CUDA)
include_guard(GLOBAL)
include(CMakeFindDependencyMacro)
include(CheckSymbolExists)

# pmt_find_backend_(NAME REQUIRED_FLAG) sets PMT_HAVE_<NAME> to TRUE/FALSE.
macro(pmt_backend_wanted_ name)
  if(NOT DEFINED PMT_ENABLE_${name})
    set(PMT_ENABLE_${name} AUTO)
  endif()
  string(TOUPPER "${PMT_ENABLE_${name}}" _pmt_want)
  set(_pmt_required FALSE)
  set(_pmt_try TRUE)
  if(_pmt_want STREQUAL "OFF" OR _pmt_want STREQUAL "FALSE" OR _pmt_want STREQUAL "0")
    set(_pmt_try FALSE)
  elseif(NOT _pmt_want STREQUAL "AUTO")
    set(_pmt_required TRUE)
  endif()
endmacro()

macro(pmt_backend_result_ name found)
  set(PMT_HAVE_${name} ${found})
  if(_pmt_required AND NOT PMT_HAVE_${name})
    message(FATAL_ERROR "pmt: PMT_ENABLE_${name}=${PMT_ENABLE_${name}} but ${name} was not found")
  endif()
endmacro()

# --- MPI -------------------------------------------------------------------------------------
pmt_backend_wanted_(MPI)
set(_found FALSE)
if(_pmt_try)
  find_package(MPI COMPONENTS CXX QUIET)
  if(MPI_CXX_FOUND)
    set(_found TRUE)
  endif()
endif()
pmt_backend_result_(MPI ${_found})

# --- CBLAS (OpenBLAS) ------------------------------------------------------------------------
# An OpenBLAS threaded with OpenMP shares Kokkos' OpenMP thread pool. The pthread build (Debian's
# default alternative) keeps its own threads spinning between calls and fights Kokkos' threads
# for the cores: a GPT training step ran 2.5x slower with it (docs/benchmarks.md). So where
# Debian's OpenMP build is installed it is linked by path (PMT_PREFER_OPENMP_BLAS, default ON).
pmt_backend_wanted_(CBLAS)
set(_found FALSE)
if(NOT DEFINED PMT_PREFER_OPENMP_BLAS)
  set(PMT_PREFER_OPENMP_BLAS ON)
endif()
if(_pmt_try)
  set(_pmt_blas_libs)
  if(PMT_CBLAS_LIBRARIES_USER)
    # Bring your own CBLAS (MKL, BLIS, AOCL, ...): its libraries as given, its header directory
    # PMT_CBLAS_INCLUDE_DIR with cblas.h, or MKL's mkl_cblas.h (then PMT_CBLAS_MKL=1).
    set(_pmt_blas_libs ${PMT_CBLAS_LIBRARIES_USER})
    if(NOT PMT_CBLAS_INCLUDE_DIR OR (NOT EXISTS "${PMT_CBLAS_INCLUDE_DIR}/cblas.h"
                                     AND NOT EXISTS "${PMT_CBLAS_INCLUDE_DIR}/mkl_cblas.h"))
      message(FATAL_ERROR "pmt: PMT_CBLAS_LIBRARIES_USER is set, but PMT_CBLAS_INCLUDE_DIR "
              "('${PMT_CBLAS_INCLUDE_DIR}') holds neither cblas.h nor mkl_cblas.h; point it at the "
              "directory of that CBLAS' header")
    endif()
  elseif(PMT_PREFER_OPENMP_BLAS AND CMAKE_LIBRARY_ARCHITECTURE)
    find_library(PMT_OPENBLAS_OPENMP_LIBRARY openblas
                 PATHS /usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-openmp NO_DEFAULT_PATH)
    find_path(PMT_OPENBLAS_OPENMP_INCLUDE_DIR cblas.h
              PATHS /usr/include/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-openmp NO_DEFAULT_PATH)
    if(PMT_OPENBLAS_OPENMP_LIBRARY AND PMT_OPENBLAS_OPENMP_INCLUDE_DIR)
      set(_pmt_blas_libs ${PMT_OPENBLAS_OPENMP_LIBRARY})
      set(PMT_CBLAS_INCLUDE_DIR ${PMT_OPENBLAS_OPENMP_INCLUDE_DIR})
    endif()
  endif()
  if(NOT _pmt_blas_libs)
    if(NOT DEFINED BLA_VENDOR)
      set(BLA_VENDOR OpenBLAS)
    endif()
    find_package(BLAS QUIET)
    find_path(PMT_CBLAS_INCLUDE_DIR cblas.h PATH_SUFFIXES openblas openblas-pthread)
    if(BLAS_FOUND)
      set(_pmt_blas_libs ${BLAS_LIBRARIES})
    endif()
  endif()
  if(_pmt_blas_libs AND PMT_CBLAS_INCLUDE_DIR)
    set(_found TRUE)
    set(PMT_CBLAS_LIBRARIES ${_pmt_blas_libs})
    if(NOT TARGET pmt_deps::cblas)
      add_library(pmt_deps::cblas INTERFACE IMPORTED GLOBAL)
      target_link_libraries(pmt_deps::cblas INTERFACE ${_pmt_blas_libs})
      target_include_directories(pmt_deps::cblas SYSTEM INTERFACE ${PMT_CBLAS_INCLUDE_DIR})
      if(NOT EXISTS "${PMT_CBLAS_INCLUDE_DIR}/cblas.h" AND EXISTS "${PMT_CBLAS_INCLUDE_DIR}/mkl_cblas.h")
        target_compile_definitions(pmt_deps::cblas INTERFACE PMT_CBLAS_MKL=1)
      endif()
      set(CMAKE_REQUIRED_INCLUDES ${PMT_CBLAS_INCLUDE_DIR})
      set(CMAKE_REQUIRED_LIBRARIES ${_pmt_blas_libs})
      check_symbol_exists(openblas_get_corename "cblas.h" PMT_HAVE_OPENBLAS_INFO)
      unset(CMAKE_REQUIRED_INCLUDES)
      unset(CMAKE_REQUIRED_LIBRARIES)
      if(PMT_HAVE_OPENBLAS_INFO)
        target_compile_definitions(pmt_deps::cblas INTERFACE PMT_HAVE_OPENBLAS_INFO=1)
      endif()
    endif()
  endif()
endif()
pmt_backend_result_(CBLAS ${_found})

# --- CUDA runtime + cuBLAS, NCCL (host-compiled; no CUDA language needed) ----------------------
# AUTO takes them only where the Kokkos found computes on CUDA: a CPU-only pmt puts no CUDA include
# path or library on its consumers' lines and needs no CUDA toolkit at find_package(pmt). ON
# takes them on any Kokkos (pmt's own suite: host-compiled cuBLAS and NCCL code, and the
# compile-only Kokkos::Cuda check against newer Kokkos headers).
pmt_backend_wanted_(CUDA)
set(_found FALSE)
if(_pmt_try AND NOT _pmt_required AND NOT "CUDA" IN_LIST Kokkos_DEVICES)
  set(_pmt_try FALSE)
endif()
if(_pmt_try)
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND AND TARGET CUDA::cudart AND TARGET CUDA::cublas)
    set(_found TRUE)
  endif()
endif()
pmt_backend_result_(CUDA ${_found})

pmt_backend_wanted_(NCCL)
set(_found FALSE)
if(_pmt_try AND PMT_HAVE_CUDA)
  find_library(PMT_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT})
  find_path(PMT_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
  if(PMT_NCCL_LIBRARY AND PMT_NCCL_INCLUDE_DIR)
    set(_found TRUE)
    if(NOT TARGET pmt_deps::nccl)
      add_library(pmt_deps::nccl INTERFACE IMPORTED GLOBAL)
      target_link_libraries(pmt_deps::nccl INTERFACE ${PMT_NCCL_LIBRARY} CUDA::cudart)
      target_include_directories(pmt_deps::nccl SYSTEM INTERFACE ${PMT_NCCL_INCLUDE_DIR})
    endif()
  endif()
endif()
pmt_backend_result_(NCCL ${_found})
unset(_found)
