# SPDX-License-Identifier: Apache-2.0
# A CPU-only pmt on a machine with the CUDA toolkit installed: pmt configured with its defaults
# (PMT_ENABLE_CUDA/NCCL=AUTO) against a Kokkos without CUDA, installed, and a user's project
# (tests/install) built against the installed package. Checks that
#   - pmt takes neither CUDA nor NCCL (its configure summary);
#   - find_package(pmt) needs no CUDA toolkit (the consumer configures with CUDAToolkit disabled);
#   - no CUDA include path, definition or library reaches the consumer's compile and link lines.
#
#   cmake -DSOURCE=<pmt source> -DCONSUMER=<tests/install> -DWORK=<dir> -DKokkos_DIR=<cpu Kokkos>
#         [-DGENERATOR=...] -P cpu_only.cmake
foreach(v SOURCE CONSUMER WORK Kokkos_DIR)
  if(NOT ${v})
    message(FATAL_ERROR "cpu_only.cmake: -D${v}=... is required")
  endif()
endforeach()
if(NOT GENERATOR)
  set(GENERATOR "Unix Makefiles")
endif()
file(REMOVE_RECURSE ${WORK})

function(run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "cpu_only: ${what} failed (${rc}):\n${out}")
  endif()
  set(out "${out}" PARENT_SCOPE)
endfunction()

run("configuring pmt" ${CMAKE_COMMAND} -S ${SOURCE} -B ${WORK}/pmt -G ${GENERATOR} -DKokkos_DIR=${Kokkos_DIR}
    -DPMT_ENABLE_TESTS=OFF -DPMT_ENABLE_EXAMPLES=OFF -DPMT_ENABLE_BENCH=OFF)
if(NOT out MATCHES "-- pmt [0-9.]+: Kokkos [^\n]*, CUDA=FALSE, NCCL=FALSE")
  message(FATAL_ERROR "cpu_only: pmt took CUDA or NCCL on a Kokkos without CUDA:\n${out}")
endif()
run("installing pmt" ${CMAKE_COMMAND} --install ${WORK}/pmt --prefix ${WORK}/prefix)
run("configuring the consumer" ${CMAKE_COMMAND} -S ${CONSUMER} -B ${WORK}/consumer -G ${GENERATOR}
    -DCMAKE_PREFIX_PATH=${WORK}/prefix -DKokkos_DIR=${Kokkos_DIR} -DCMAKE_BUILD_TYPE=Release
    -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON -DCMAKE_EXPORT_COMPILE_COMMANDS=ON)
run("building the consumer" ${CMAKE_COMMAND} --build ${WORK}/consumer --verbose)
set(lines "${out}")
file(READ ${WORK}/consumer/compile_commands.json commands)
string(APPEND lines "\n${commands}")
file(GLOB_RECURSE link_files ${WORK}/consumer/CMakeFiles/*/link.txt)
foreach(f IN LISTS link_files)
  file(READ ${f} link)
  string(APPEND lines "\n${link}")
endforeach()
if(NOT link_files OR NOT commands MATCHES "main\\.cpp")
  message(FATAL_ERROR "cpu_only: no compile or link line of the consumer to check")
endif()
# the directories of this check (whatever their names) are not what it looks for
foreach(dir ${WORK} ${SOURCE} ${Kokkos_DIR})
  string(REPLACE "${dir}" "<dir>" lines "${lines}")
endforeach()
string(TOLOWER "${lines}" lower)
foreach(word cuda cublas nccl)
  string(FIND "${lower}" "${word}" at)
  if(NOT at EQUAL -1)
    string(SUBSTRING "${lines}" ${at} 200 context)
    message(FATAL_ERROR "cpu_only: '${word}' reaches a CPU-only consumer's build: ...${context}")
  endif()
endforeach()
message(STATUS "cpu_only: CUDA=FALSE, NCCL=FALSE; find_package(pmt) without the CUDA toolkit; "
               "no CUDA path, definition or library on the consumer's compile and link lines")
