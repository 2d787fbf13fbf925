# Installs datapar from BUILD_DIR into a fresh prefix, then configures (for C++14), builds and
# runs the consumer project against it with find_package(datapar), alone and as two ranks
# started by the installed launcher. Run with cmake -P.
file(REMOVE_RECURSE "${WORK_DIR}")

function(step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "consumer test: ${what} failed (${rc})\n${out}\n${err}")
  endif()
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

step("install" ${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${WORK_DIR}/prefix")
step("configure" ${CMAKE_COMMAND} -S "${SOURCE_DIR}/tests/consumer" -B "${WORK_DIR}/build" -G "${GENERATOR}"
     -DCMAKE_BUILD_TYPE=Release "-DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix")
step("build" ${CMAKE_COMMAND} --build "${WORK_DIR}/build")
step("run" "${WORK_DIR}/build/consumer")
if(NOT step_output MATCHES "consumer ok")
  message(FATAL_ERROR "consumer test: unexpected output: ${step_output}")
endif()
message(STATUS "${step_output}")

if(NOT EXISTS "${WORK_DIR}/prefix/bin/datapar" OR NOT EXISTS "${WORK_DIR}/prefix/bin/datapar-torch")
  message(FATAL_ERROR "consumer test: the install has no bin/datapar and bin/datapar-torch")
endif()
step("launch" "${WORK_DIR}/prefix/bin/datapar" launch --nproc-per-node 2 -- "${WORK_DIR}/build/consumer" ranks)
foreach(rank 0 1)
  if(NOT step_output MATCHES "consumer rank ${rank} of 2: bias gradient 1.5")
    message(FATAL_ERROR "consumer test: rank ${rank} of the launched job did not report:\n${step_output}")
  endif()
endforeach()
step("installed datapar-torch" "${WORK_DIR}/prefix/bin/datapar" devices)
message(STATUS "${step_output}")
