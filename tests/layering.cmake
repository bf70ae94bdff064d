# SPDX-License-Identifier: Apache-2.0
# The library's layers, bottom up (docs/design.md): a header may include headers of its own
# folder and of folders before it, never after; and no library header includes the tools layer
# (plan/, io/dataset.hpp, obs/peak.hpp, tools.hpp); the layers (nn/) reach the communicators only
# through parallel/regions.hpp: of comm/ they include the Mesh and the backend tags. The run
# harness (run/) is the top layer: no library header includes it, nor does the umbrella pmt.hpp.
# Run: cmake -DROOT=<repo> -P layering.cmake
set(order detail core policy comm ops parallel nn optim train io obs run)
set(tools_re "^(plan/|io/dataset\\.hpp|obs/peak\\.hpp|tools\\.hpp)")
file(GLOB_RECURSE headers RELATIVE ${ROOT}/include/pmt ${ROOT}/include/pmt/*.hpp)
set(bad "")
foreach(h IN LISTS headers)
  if(h MATCHES "${tools_re}" OR NOT h MATCHES "/")
    continue()  # the tools themselves and the umbrella headers
  endif()
  string(REGEX MATCH "^[a-z_]+" dir "${h}")
  list(FIND order ${dir} rank)
  file(STRINGS ${ROOT}/include/pmt/${h} includes REGEX "^#include \"pmt/[a-z_]+/")
  foreach(line IN LISTS includes)
    string(REGEX REPLACE "^#include \"pmt/([^\"]+)\".*" "\\1" inc "${line}")
    string(REGEX MATCH "^[a-z_]+" idir "${inc}")
    list(FIND order ${idir} irank)
    if(inc MATCHES "${tools_re}")
      string(APPEND bad "  ${h} includes the tools header ${inc}\n")
    elseif(dir STREQUAL "nn" AND idir STREQUAL "comm" AND NOT inc MATCHES "^comm/(mesh|backend)\\.hpp$")
      string(APPEND bad "  ${h} (a layer) includes ${inc}; layers communicate through parallel/regions.hpp\n")
    elseif(irank GREATER rank)
      string(APPEND bad "  ${h} (layer ${dir}) includes ${inc} (layer ${idir}, above it)\n")
    endif()
  endforeach()
endforeach()
file(STRINGS ${ROOT}/include/pmt/pmt.hpp umbrella REGEX "^#include \"pmt/")
foreach(line IN LISTS umbrella)
  string(REGEX REPLACE "^#include \"pmt/([^\"]+)\".*" "\\1" inc "${line}")
  if(inc MATCHES "^run/|^run\\.hpp$" OR inc MATCHES "${tools_re}")
    string(APPEND bad "  pmt.hpp (the library's umbrella) includes ${inc}, a header of the run harness or the tools\n")
  endif()
endforeach()
if(bad)
  message(FATAL_ERROR "pmt layering: headers break the layers:\n${bad}")
endif()
list(LENGTH headers n)
message(STATUS "pmt layering: ${n} headers include only their own layer and those below it")
