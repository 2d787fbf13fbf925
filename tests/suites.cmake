# Writes the CTest file that registers one CTest test per GoogleTest suite of a test program
# (tests/CMakeLists.txt, datapar_add_suites), run after each link of the program:
#
#   cmake -D EXE=<program> -D OUT=<ctest file> -D RESULTS=<dir> -P suites.cmake
#
# Each suite runs in one process (--gtest_filter=Suite.*), not each test in its own: a process
# that loads libtorch costs 0.3 s to start, 0.8 s under AddressSanitizer, and the suite has
# 500 tests in 98 suites. Each run writes GoogleTest's JSON report to RESULTS/<suite>.json,
# which scripts/test_counts.py reads to count the tests passed, failed and skipped.
execute_process(COMMAND ${EXE} --gtest_list_tests OUTPUT_VARIABLE listing ERROR_VARIABLE errors
                RESULT_VARIABLE rc TIMEOUT 120)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${EXE} --gtest_list_tests failed (${rc}):\n${errors}${listing}")
endif()
string(REPLACE "\n" ";" lines "${listing}")
set(suites)
foreach(line IN LISTS lines)
  if(line MATCHES "^([A-Za-z0-9_/]+)\\.")  # "Suite." or "Instance/Suite." (# TypeParam = ...)
    set(suite "${CMAKE_MATCH_1}")
    list(APPEND suites "${suite}")
    set("tests_${suite}" 0)
  elseif(line MATCHES "^  [A-Za-z0-9_/]+")
    math(EXPR "tests_${suite}" "${tests_${suite}} + 1")
  endif()
endforeach()
if(NOT suites)
  message(FATAL_ERROR "${EXE} lists no test:\n${listing}")
endif()

set(content "# Written by tests/suites.cmake from ${EXE} --gtest_list_tests; do not edit.\n")
foreach(suite IN LISTS suites)
  string(REPLACE "/" "_" file "${suite}")
  set(n "${tests_${suite}}")
  # Each test bounds its own waits (300 s was the limit of one test); a suite gets a minute
  # more per test beyond the first.
  math(EXPR timeout "300 + 60 * (${n} - 1)")
  string(APPEND content
    "add_test([=[${suite}]=] [=[${EXE}]=] [=[--gtest_filter=${suite}.*]=] "
    "[=[--gtest_output=json:${RESULTS}/${file}.json]=])\n"
    "set_tests_properties([=[${suite}]=] PROPERTIES TIMEOUT ${timeout} COST ${n} LABELS suite)\n")
endforeach()
file(WRITE "${OUT}" "${content}")
