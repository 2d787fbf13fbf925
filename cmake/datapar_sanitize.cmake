# Sanitizer and fuzzing builds (issue 13).
#
# DATAPAR_SANITIZE=address,undefined (make test-asan) or thread (make test-tsan) compiles and
# links every target with -fsanitize=<that>; a sanitizer report ends the process with an
# error (no recovery), so CTest sees it as a failed test. The runtime options and the
# suppressions, each explained, are in tests/sanitizers/.
# DATAPAR_FUZZ (clang only) instruments the library for libFuzzer's coverage, so the fuzz
# targets in fuzz/ see inside the parsers they call.
if(DATAPAR_SANITIZE)
  if(NOT DATAPAR_SANITIZE MATCHES "^(address|undefined|address,undefined|undefined,address|thread)$")
    message(FATAL_ERROR "DATAPAR_SANITIZE=${DATAPAR_SANITIZE}: use address,undefined or thread.")
  endif()
  set(DATAPAR_SANITIZE_FLAGS -fsanitize=${DATAPAR_SANITIZE} -fno-omit-frame-pointer -fno-sanitize-recover=all)
  if(DATAPAR_SANITIZE MATCHES "undefined")
    # vptr checks need the type information of every class a pointer is checked against;
    # libtorch's shared libraries are not built for it, and its classes (torch::nn::Module,
    # at::TensorImpl) cross library boundaries everywhere: every such check would be a false
    # report. The other undefined-behaviour checks stay on.
    list(APPEND DATAPAR_SANITIZE_FLAGS -fno-sanitize=vptr)
  endif()
  add_compile_options(${DATAPAR_SANITIZE_FLAGS})
  add_link_options(-fsanitize=${DATAPAR_SANITIZE})
endif()
if(DATAPAR_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "DATAPAR_FUZZ needs clang (libFuzzer): configure with -DCMAKE_CXX_COMPILER=clang++.")
  endif()
  add_compile_options(-fsanitize=fuzzer-no-link)
endif()

# A sanitized library needs the sanitizer's runtime in every program that links it, including
# find_package(datapar) consumers: the link option travels with the exported target.
function(datapar_sanitize_library target)
  if(DATAPAR_SANITIZE)
    target_link_options(${target} INTERFACE -fsanitize=${DATAPAR_SANITIZE})
  endif()
endfunction()

# Adds cmake/sanitizer_hooks.cc to every program of an AddressSanitizer build, and to those that
# link Torch cmake/asan_cpu_allocator.cc (Torch's CPU allocator reusing large blocks within ASan's
# rules: Note [Large blocks under AddressSanitizer]); each compiled once. Called once at the end
# of the top CMakeLists.txt, when every target exists.
function(datapar_sanitize_programs)
  if(NOT DATAPAR_SANITIZE MATCHES "address")
    return()
  endif()
  add_library(datapar_sanitizer_hooks OBJECT ${CMAKE_SOURCE_DIR}/cmake/sanitizer_hooks.cc)
  add_library(datapar_asan_cpu_allocator OBJECT ${CMAKE_SOURCE_DIR}/cmake/asan_cpu_allocator.cc)
  target_link_libraries(datapar_asan_cpu_allocator PRIVATE ${TORCH_LIBRARIES})
  set(directories ${CMAKE_SOURCE_DIR})
  while(directories)
    list(POP_FRONT directories directory)
    get_property(subdirectories DIRECTORY ${directory} PROPERTY SUBDIRECTORIES)
    list(APPEND directories ${subdirectories})
    get_property(targets DIRECTORY ${directory} PROPERTY BUILDSYSTEM_TARGETS)
    foreach(target IN LISTS targets)
      get_target_property(type ${target} TYPE)
      if(NOT type STREQUAL "EXECUTABLE")
        continue()
      endif()
      target_sources(${target} PRIVATE $<TARGET_OBJECTS:datapar_sanitizer_hooks>)
      get_target_property(libraries ${target} LINK_LIBRARIES)
      if(libraries MATCHES "(^|;)datapar(_train)?(;|$)")
        target_sources(${target} PRIVATE $<TARGET_OBJECTS:datapar_asan_cpu_allocator>)
      endif()
    endforeach()
  endwhile()
endfunction()
