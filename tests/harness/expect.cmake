# SPDX-License-Identifier: Apache-2.0
# cmake -DCMD="a|b|c" -DEXPECT_RC=nonzero|zero [-DREGEX=...] [-DTIMEOUT=s] [-DMAX_SECONDS=s] -P expect.cmake
# Runs CMD and passes only if its exit status is as expected, its output matches REGEX, and it
# ended within MAX_SECONDS. Used for tests that must fail in a specific way (compile-fail tests,
# a harness run that must fail, a hang that must be ended by the timeout).
string(REPLACE "|" ";" CMD "${CMD}")
string(TIMESTAMP t0 "%s")
set(_timeout_args)
if(DEFINED TIMEOUT)
  set(_timeout_args TIMEOUT ${TIMEOUT})
endif()
execute_process(COMMAND ${CMD} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err ${_timeout_args})
string(TIMESTAMP t1 "%s")
math(EXPR elapsed "${t1} - ${t0}")
set(all "${out}\n${err}")
message("${all}")
message("exit status: ${rc}, elapsed ${elapsed} s")
if(EXPECT_RC STREQUAL "nonzero" AND rc EQUAL 0)
  message(FATAL_ERROR "expected a non-zero exit status, got 0")
elseif(EXPECT_RC STREQUAL "zero" AND NOT rc EQUAL 0)
  message(FATAL_ERROR "expected exit status 0, got ${rc}")
endif()
if(DEFINED REGEX AND NOT all MATCHES "${REGEX}")
  message(FATAL_ERROR "output does not match the expected pattern: ${REGEX}")
endif()
if(DEFINED MAX_SECONDS AND elapsed GREATER MAX_SECONDS)
  message(FATAL_ERROR "took ${elapsed} s, more than ${MAX_SECONDS} s")
endif()
