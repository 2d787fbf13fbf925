# Finds the Torch to build against and refuses, with one message, the ones datapar cannot use.
#
# Supported: libtorch 1.13 (Debian bookworm's libtorch-dev) and 2.x (pytorch.org's zip, or the
# `torch` wheel from pip), CPU or CUDA, cxx11 ABI. Point CMake at a Torch with
#   -DCMAKE_PREFIX_PATH=/path/to/libtorch                      (the zip)
#   -DCMAKE_PREFIX_PATH="$(python -c 'import torch; print(torch.utils.cmake_prefix_path)')"  (pip)
#   -DTorch_DIR=/path/to/share/cmake/Torch
#
# Why not a bare find_package(Torch): TorchConfig looks for libc10 and libtorch with
# find_library, which searches the system directories before the Torch's own. With Debian's
# libtorch-dev installed beside a pip or zip Torch, that links Debian's libc10 1.13 under
# the other Torch's headers. So the libraries are looked up in the chosen Torch first.
#
# Sets, besides what TorchConfig sets:
#   DATAPAR_TORCH_VERSION      e.g. 2.15.0
#   DATAPAR_TORCH_ROOT         the Torch's install prefix (holds lib/ and include/; zip, pip)
#   DATAPAR_TORCH_HAS_CUDA     1 when the Torch was built with CUDA
#   DATAPAR_TORCH_CARRIES_GLOO 1 when libtorch_cpu holds its own copy of gloo (pip, zip)
#   DATAPAR_TORCH_CXX_STANDARD 20 where the Torch requires it, else 17; also CMAKE_CXX_STANDARD
#                              unless DATAPAR_TORCH_KEEP_CXX_STANDARD
set(DATAPAR_MIN_TORCH_VERSION 1.13)

function(_datapar_fail)
  string(JOIN "" text ${ARGN})
  message(FATAL_ERROR "datapar: ${text}")
endfunction()

# The directory of TorchConfig.cmake that find_package would load, when the user named one.
function(_datapar_named_torch_dir out)
  set(candidates)
  if(Torch_DIR)
    list(APPEND candidates "${Torch_DIR}")
  endif()
  if(DEFINED ENV{Torch_DIR})
    list(APPEND candidates "$ENV{Torch_DIR}")
  endif()
  set(prefixes ${CMAKE_PREFIX_PATH})
  if(DEFINED ENV{CMAKE_PREFIX_PATH})
    string(REPLACE ":" ";" env_prefixes "$ENV{CMAKE_PREFIX_PATH}")
    list(APPEND prefixes ${env_prefixes})
  endif()
  foreach(p IN LISTS prefixes)
    list(APPEND candidates "${p}/Torch" "${p}/share/cmake/Torch" "${p}/lib/cmake/Torch")
  endforeach()
  foreach(dir IN LISTS candidates)
    if(EXISTS "${dir}/TorchConfig.cmake")
      get_filename_component(dir "${dir}" REALPATH)
      set(${out} "${dir}" PARENT_SCOPE)
      return()
    endif()
  endforeach()
  set(${out} "" PARENT_SCOPE)
endfunction()

# pip's torch runs on the CUDA libraries of its nvidia-* wheels (<site-packages>/nvidia/*/lib,
# found through libtorch_cuda's RPATH), which can be newer than the toolkit's: torch 2.15 needs
# NCCL 2.30 symbols that the CUDA 13.0 toolkit's NCCL 2.28 lacks. One runtime per process, so
# datapar links the wheels' cudart, nvrtc and NCCL too, and takes only nvcc and headers from
# the toolkit. A zip or Debian Torch has no wheels beside it and uses the toolkit's.
function(_datapar_use_wheel_cuda torch_root)
  get_filename_component(wheels "${torch_root}/../nvidia" ABSOLUTE)
  if(NOT IS_DIRECTORY "${wheels}")
    return()
  endif()
  file(GLOB cudart "${wheels}/*/lib/libcudart.so.[0-9]*")
  file(GLOB nvrtc "${wheels}/*/lib/libnvrtc.so.[0-9]*")
  file(GLOB nccl "${wheels}/nccl/lib/libnccl.so.[0-9]*")
  if(cudart)
    list(GET cudart 0 cudart)
    set(CUDA_cudart_LIBRARY "${cudart}" CACHE FILEPATH "cudart of torch's nvidia wheel" FORCE)
  endif()
  if(nvrtc)
    list(GET nvrtc 0 nvrtc)
    set(CUDA_nvrtc_LIBRARY "${nvrtc}" CACHE FILEPATH "nvrtc of torch's nvidia wheel" FORCE)
    set(CUDA_NVRTC_LIB "${nvrtc}" CACHE FILEPATH "nvrtc of torch's nvidia wheel" FORCE)
  endif()
  if(nccl AND EXISTS "${wheels}/nccl/include/nccl.h")
    list(GET nccl 0 nccl)
    set(NCCL_LIBRARY "${nccl}" CACHE FILEPATH "NCCL of torch's nvidia wheel" FORCE)
    set(NCCL_INCLUDE_DIR "${wheels}/nccl/include" CACHE PATH "NCCL of torch's nvidia wheel" FORCE)
  endif()
endfunction()

macro(datapar_find_torch)
  _datapar_named_torch_dir(_datapar_torch_dir)
  if(_datapar_torch_dir)
    # TorchConfig looks for its Caffe2Config in the system's prefixes before its own folder:
    # with Debian's libtorch-dev installed, a Torch named by Torch_DIR alone got Debian's.
    set(Torch_DIR "${_datapar_torch_dir}" CACHE PATH "The Torch datapar builds against" FORCE)
    if(EXISTS "${_datapar_torch_dir}/../Caffe2/Caffe2Config.cmake")
      get_filename_component(_datapar_caffe2_dir "${_datapar_torch_dir}/../Caffe2" ABSOLUTE)
      set(Caffe2_DIR "${_datapar_caffe2_dir}" CACHE PATH "The Caffe2 config of the Torch datapar builds against" FORCE)
    endif()
    # <root>/share/cmake/Torch (zip, pip): the libraries are in <root>/lib. Pin them there.
    get_filename_component(_datapar_root "${_datapar_torch_dir}/../../.." ABSOLUTE)
    if(EXISTS "${_datapar_root}/lib")
      # library:the cache variable TorchConfig's find_library call fills.
      foreach(_pin c10:c10_LIBRARY c10_cuda:C10_CUDA_LIBRARY torch:TORCH_LIBRARY kineto:kineto_LIBRARY)
        string(REPLACE ":" ";" _pin "${_pin}")
        list(GET _pin 0 _lib)
        list(GET _pin 1 _var)
        unset(_datapar_lib CACHE)
        find_library(_datapar_lib ${_lib} PATHS "${_datapar_root}/lib" NO_DEFAULT_PATH)
        if(_datapar_lib)
          set(${_var} "${_datapar_lib}" CACHE FILEPATH "" FORCE)
        endif()
        unset(_datapar_lib CACHE)
      endforeach()
      # A CUDA Torch's own config needs the CUDA toolkit; say so before it fails in its own words.
      if(EXISTS "${_datapar_root}/lib/libc10_cuda.so")
        _datapar_use_wheel_cuda("${_datapar_root}")
        find_package(CUDAToolkit QUIET)
        if(NOT CUDAToolkit_FOUND)
          _datapar_fail(
            "the Torch at ${_datapar_root} was built with CUDA, and configuring against it needs the CUDA "
            "toolkit (nvcc, cudart, NVCC headers), which was not found. Install the CUDA toolkit and pass "
            "-DCUDAToolkit_ROOT=/usr/local/cuda (or put nvcc on PATH), or build against a CPU libtorch "
            "(Debian: apt-get install libtorch-dev; pytorch.org: the CPU zip).")
        endif()
        if(NOT CMAKE_CUDA_COMPILER AND CUDAToolkit_NVCC_EXECUTABLE)
          set(CMAKE_CUDA_COMPILER "${CUDAToolkit_NVCC_EXECUTABLE}" CACHE FILEPATH "" FORCE)
        endif()
      endif()
    endif()
  endif()

  find_package(Torch QUIET)
  if(NOT Torch_FOUND)
    _datapar_fail(
      "no Torch found. Install Debian's (apt-get install libtorch-dev), or point CMake at one: "
      "-DCMAKE_PREFIX_PATH=/path/to/libtorch for pytorch.org's zip, or "
      "-DCMAKE_PREFIX_PATH=\"$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')\" for pip's torch.")
  endif()
  set(DATAPAR_TORCH_VERSION "${Torch_VERSION}")
  if(NOT DATAPAR_TORCH_VERSION)
    set(DATAPAR_TORCH_VERSION "${PACKAGE_VERSION}")
  endif()
  if(DATAPAR_TORCH_VERSION VERSION_LESS DATAPAR_MIN_TORCH_VERSION)
    _datapar_fail(
      "Torch ${DATAPAR_TORCH_VERSION} (${Torch_DIR}) is older than ${DATAPAR_MIN_TORCH_VERSION}, the oldest datapar "
      "supports. Install a newer one (Debian bookworm's libtorch-dev is 1.13; pip install torch for 2.x) and "
      "point -DCMAKE_PREFIX_PATH at it.")
  endif()
  if("${TORCH_CXX_FLAGS}" MATCHES "_GLIBCXX_USE_CXX11_ABI=0")
    _datapar_fail(
      "Torch ${DATAPAR_TORCH_VERSION} (${Torch_DIR}) was built with the pre-cxx11 ABI "
      "(-D_GLIBCXX_USE_CXX11_ABI=0), which cannot link with the system's C++ libraries (gloo, MPI, GoogleTest). "
      "Download the cxx11 ABI build instead (pytorch.org: 'libtorch-cxx11-abi-shared-with-deps-...zip').")
  endif()
  get_filename_component(DATAPAR_TORCH_ROOT "${Torch_DIR}/../../.." ABSOLUTE)

  set(DATAPAR_TORCH_HAS_CUDA 0)
  if(TARGET torch_cuda OR TARGET c10_cuda)
    set(DATAPAR_TORCH_HAS_CUDA 1)
  endif()

  # The C++ standard follows the Torch: 2.x's headers require C++20 and say so on the torch target.
  get_target_property(_datapar_features torch INTERFACE_COMPILE_FEATURES)
  get_target_property(_datapar_options torch INTERFACE_COMPILE_OPTIONS)
  if("${_datapar_features}" MATCHES "cxx_std_20" OR "${_datapar_options}" MATCHES "std=c\\+\\+20")
    set(DATAPAR_TORCH_CXX_STANDARD 20)
  else()
    set(DATAPAR_TORCH_CXX_STANDARD 17)
  endif()
  if(NOT DATAPAR_TORCH_KEEP_CXX_STANDARD)  # a consumer's own setting stays; torch's target raises it
    set(CMAKE_CXX_STANDARD ${DATAPAR_TORCH_CXX_STANDARD})
  endif()

  # Does libtorch_cpu define gloo's symbols itself (pip, zip), or link the system's libgloo
  # (Debian)? See Note [Two copies of gloo] in src/process_group/gloo/transport_plugin.cc.
  # The file is the one the torch_cpu target links, as the Torch's own config names it.
  set(DATAPAR_TORCH_CARRIES_GLOO 0)
  set(_datapar_torch_cpu "")
  if(TARGET torch_cpu)
    get_target_property(_datapar_torch_cpu torch_cpu LOCATION)
  endif()
  if(_datapar_torch_cpu AND CMAKE_NM)
    execute_process(COMMAND "${CMAKE_NM}" -D --defined-only "${_datapar_torch_cpu}"
                    COMMAND grep -m 1 -c "_ZN4gloo"
                    OUTPUT_VARIABLE _datapar_gloo_symbols OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(_datapar_gloo_symbols GREATER 0)
      set(DATAPAR_TORCH_CARRIES_GLOO 1)
    endif()
  endif()
  message(STATUS "datapar: Torch ${DATAPAR_TORCH_VERSION} from ${Torch_DIR} (CUDA: ${DATAPAR_TORCH_HAS_CUDA}, "
                 "own gloo: ${DATAPAR_TORCH_CARRIES_GLOO}), C++${DATAPAR_TORCH_CXX_STANDARD}")
endmacro()
