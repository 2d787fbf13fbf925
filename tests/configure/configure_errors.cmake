# CTest configure_errors: configuring datapar against a Torch it cannot use fails at configure
# time with one message that says what to install or pass. The Torches are fakes: a
# TorchConfig.cmake of the version, ABI or CUDA build in question. Run with cmake -P and
# -DSOURCE_DIR -DWORK_DIR -DGENERATOR -DMAKE_PROGRAM -DCXX_COMPILER.
file(REMOVE_RECURSE "${WORK_DIR}")

# A fake Torch at WORK_DIR/NAME: share/cmake/Torch/TorchConfig{,Version}.cmake and lib/.
function(fake_torch name version config_body)
  set(root "${WORK_DIR}/${name}")
  file(WRITE "${root}/share/cmake/Torch/TorchConfigVersion.cmake"
       "set(PACKAGE_VERSION ${version})\nset(PACKAGE_VERSION_COMPATIBLE TRUE)\n")
  file(WRITE "${root}/share/cmake/Torch/TorchConfig.cmake" "${config_body}\n")
  file(MAKE_DIRECTORY "${root}/lib" "${root}/include")
endfunction()

function(expect_configure_error name expected)
  execute_process(
    COMMAND ${CMAKE_COMMAND} -S "${SOURCE_DIR}" -B "${WORK_DIR}/build-${name}" -G "${GENERATOR}"
            "-DCMAKE_PREFIX_PATH=${WORK_DIR}/${name}" -DDATAPAR_BUILD_TESTS=OFF ${ARGN}
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(rc EQUAL 0)
    message(FATAL_ERROR "configure_errors: ${name}: configuring succeeded; expected: ${expected}")
  endif()
  string(REPLACE "\n" " " flat "${err}")
  string(REGEX REPLACE " +" " " flat "${flat}")
  string(FIND "${flat}" "${expected}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "configure_errors: ${name}: the error does not say \"${expected}\":\n${err}")
  endif()
  message(STATUS "${name}: refused as expected (\"${expected}\")")
endfunction()

fake_torch(old 1.12.1 "set(TORCH_LIBRARIES torch)")
expect_configure_error(old "is older than 1.13, the oldest datapar supports")

fake_torch(pre_cxx11_abi 2.1.0 "set(TORCH_CXX_FLAGS \"-D_GLIBCXX_USE_CXX11_ABI=0\")")
expect_configure_error(pre_cxx11_abi "was built with the pre-cxx11 ABI")
expect_configure_error(pre_cxx11_abi "cxx11-abi-shared-with-deps")

# A CUDA Torch (it has libc10_cuda.so) where no CUDA toolkit can be found: every search is
# rooted in an empty directory, as on a machine without one.
fake_torch(cuda_without_toolkit 2.15.0 "message(FATAL_ERROR \"the fake CUDA Torch was loaded\")")
file(WRITE "${WORK_DIR}/cuda_without_toolkit/lib/libc10_cuda.so" "")
file(MAKE_DIRECTORY "${WORK_DIR}/empty-root")
expect_configure_error(cuda_without_toolkit "was built with CUDA, and configuring against it needs the CUDA toolkit"
  "-DCMAKE_FIND_ROOT_PATH=${WORK_DIR}/empty-root" -DCMAKE_FIND_ROOT_PATH_MODE_PROGRAM=ONLY
  "-DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM}" "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}"
  -DCMAKE_FIND_ROOT_PATH_MODE_LIBRARY=ONLY -DCMAKE_FIND_ROOT_PATH_MODE_INCLUDE=ONLY
  -DCMAKE_FIND_ROOT_PATH_MODE_PACKAGE=ONLY)
