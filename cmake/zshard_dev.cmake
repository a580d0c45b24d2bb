# Settings for zshard's own targets (tests, benches, examples). Consumers never see these.

# Warnings on our code only; third-party headers come in as SYSTEM. They become errors only
# when asked (the presets and CI do): a plain `cmake -B build` with another compiler version or
# build type must build, whatever new (or false: g++ 12 -O3 -Wrestrict) warnings it prints.
option(ZSHARD_WARNINGS_AS_ERRORS "Turn warnings into errors on zshard's own targets (the presets and CI do)" OFF)
add_library(zshard_dev_flags INTERFACE)
# -Wmissing-field-initializers is off because g++ 12 fires it on designated initializers that
# leave members at their defaults, which is how zshard's config aggregates are meant to be used.
target_compile_options(zshard_dev_flags INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wno-missing-field-initializers>)
if(ZSHARD_WARNINGS_AS_ERRORS)
  target_compile_options(zshard_dev_flags INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
endif()

# Sanitizers: ZSHARD_SANITIZE=address,undefined or thread (set by the presets).
set(ZSHARD_SANITIZE "" CACHE STRING "Sanitizers for zshard's own targets, e.g. address,undefined or thread")
if(ZSHARD_SANITIZE)
  target_compile_options(zshard_dev_flags INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=${ZSHARD_SANITIZE} -fno-omit-frame-pointer -fno-sanitize-recover=all>)
  target_link_options(zshard_dev_flags INTERFACE -fsanitize=${ZSHARD_SANITIZE})
endif()

find_package(Eigen3 3.4 REQUIRED NO_MODULE)
# The DeepSpeed config import (config/deepspeed_config.hpp): the main job, zshard_plan, its tests.
find_package(nlohmann_json 3 REQUIRED)
if(ZSHARD_BUILD_TESTS)
  find_package(doctest REQUIRED)
endif()

# CUDA is optional: AUTO enables it when a CUDA compiler and NCCL are found.
set(ZSHARD_WITH_CUDA OFF)
if(NOT ZSHARD_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  # sm_90 machine code (H100/H200) plus compute_90 PTX that newer GPUs JIT-compile. Plain "90"
  # means both, in one nvcc front-end pass ("90-real;90-virtual" would run it twice, +7 s per
  # file). Set before enable_language: CUDA 13 cannot build the sm_52 CMake 3.25 would pick.
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES 90)
  endif()
  # nvcc hands host code to the same g++ the C++ targets use.
  if(NOT DEFINED CMAKE_CUDA_HOST_COMPILER)
    set(CMAKE_CUDA_HOST_COMPILER ${CMAKE_CXX_COMPILER})
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    find_path(ZSHARD_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include)
    find_library(ZSHARD_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib64
                 PATHS /usr/lib/x86_64-linux-gnu)
    if(ZSHARD_NCCL_INCLUDE_DIR AND ZSHARD_NCCL_LIBRARY)
      add_library(zshard_nccl UNKNOWN IMPORTED)
      set_target_properties(zshard_nccl PROPERTIES IMPORTED_LOCATION ${ZSHARD_NCCL_LIBRARY}
                                                   INTERFACE_INCLUDE_DIRECTORIES ${ZSHARD_NCCL_INCLUDE_DIR})
      set(ZSHARD_WITH_CUDA ON)
      message(STATUS "zshard: NCCL ${ZSHARD_NCCL_LIBRARY}, CUDA architectures ${CMAKE_CUDA_ARCHITECTURES}")
    elseif(ZSHARD_CUDA STREQUAL "ON")
      message(FATAL_ERROR "ZSHARD_CUDA=ON but NCCL (nccl.h, libnccl) was not found")
    else()
      message(STATUS "zshard: nvcc found but not NCCL: CUDA targets off")
    endif()
  elseif(ZSHARD_CUDA STREQUAL "ON")
    message(FATAL_ERROR "ZSHARD_CUDA=ON but no CUDA compiler was found (set CMAKE_CUDA_COMPILER)")
  endif()
endif()
message(STATUS "zshard: CUDA targets ${ZSHARD_WITH_CUDA}")

if(ZSHARD_WITH_CUDA)
  # CMake 3.25 cannot ask nvcc for C++20 (CUDA_STANDARD 20 is unknown to it), so say it here.
  # Host-compiler warnings are errors on our code; nvcc keeps CUDA/CCCL headers out of them
  # (they are system headers to the host compiler). -Wpedantic stays off: nvcc's generated
  # host stubs are not pedantic C++. nvcc's front end warns (#554) that tensor_view's
  # constrained conversion to its const view "will not be called" for T = const void, where
  # the requires-clause already excludes it: silenced as a false positive.
  add_library(zshard_cuda_flags INTERFACE)
  target_compile_options(zshard_cuda_flags INTERFACE
    $<$<COMPILE_LANGUAGE:CUDA>:-std=c++20 -Xcompiler=-Wall,-Wextra,-Wno-missing-field-initializers
      -Werror=cross-execution-space-call -diag-suppress=554>)
  if(ZSHARD_WARNINGS_AS_ERRORS)
    target_compile_options(zshard_cuda_flags INTERFACE $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Werror>)
  endif()
  target_link_libraries(zshard_cuda_flags INTERFACE CUDA::cudart zshard_nccl)
endif()

# zshard_add_cuda_test(NAME <name> SOURCES <.cu files...> LABELS <labels...> [ARGS <args...>])
# A GPU test brings its own doctest main, which exits with 77 and says why when there is no
# GPU; ctest reports that as skipped (SKIP_RETURN_CODE), so a GPU-less run stays green.
function(zshard_add_cuda_test)
  cmake_parse_arguments(ARG "" "NAME;TIMEOUT;TARGET" "SOURCES;LABELS;LIBS;ARGS" ${ARGN})
  if(NOT ARG_TARGET)
    set(ARG_TARGET ${ARG_NAME})
    add_executable(${ARG_TARGET} ${ARG_SOURCES})
    target_link_libraries(${ARG_TARGET} PRIVATE zshard::zshard zshard_cuda_flags doctest::doctest ${ARG_LIBS})
  endif()
  add_test(NAME ${ARG_NAME} COMMAND ${ARG_TARGET} ${ARG_ARGS})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 600)
  endif()
  set_tests_properties(${ARG_NAME} PROPERTIES LABELS "${ARG_LABELS}" TIMEOUT ${ARG_TIMEOUT} SKIP_RETURN_CODE 77)
endfunction()

# zshard_add_cuda_program(NAME <name> SOURCES <.cu files...>) for GPU benches and examples.
function(zshard_add_cuda_program)
  cmake_parse_arguments(ARG "" "NAME" "SOURCES;LIBS" ${ARGN})
  add_executable(${ARG_NAME} ${ARG_SOURCES})
  target_link_libraries(${ARG_NAME} PRIVATE zshard::zshard zshard_cuda_flags ${ARG_LIBS})
endfunction()

# One helper for every test program: doctest main shared, labels per area.
if(ZSHARD_BUILD_TESTS)
  add_library(zshard_doctest_main OBJECT ${PROJECT_SOURCE_DIR}/tests/doctest_main.cpp)
  target_link_libraries(zshard_doctest_main PUBLIC doctest::doctest)
endif()

# zshard_add_test(NAME <name> SOURCES <files...> LABELS <labels...>)
function(zshard_add_test)
  cmake_parse_arguments(ARG "" "NAME;TIMEOUT" "SOURCES;LABELS;LIBS" ${ARGN})
  add_executable(${ARG_NAME} ${ARG_SOURCES} $<TARGET_OBJECTS:zshard_doctest_main>)
  target_link_libraries(${ARG_NAME} PRIVATE zshard::zshard zshard_dev_flags doctest::doctest ${ARG_LIBS})
  add_test(NAME ${ARG_NAME} COMMAND ${ARG_NAME})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 600)
  endif()
  set_tests_properties(${ARG_NAME} PROPERTIES LABELS "${ARG_LABELS}" TIMEOUT ${ARG_TIMEOUT})
endfunction()

# zshard_add_program(NAME <name> SOURCES <files...>) for benches and examples.
function(zshard_add_program)
  cmake_parse_arguments(ARG "" "NAME" "SOURCES;LIBS" ${ARGN})
  add_executable(${ARG_NAME} ${ARG_SOURCES})
  target_link_libraries(${ARG_NAME} PRIVATE zshard::zshard zshard_dev_flags ${ARG_LIBS})
endfunction()
