# Settings for zshard's own targets (tests, benches, examples). Consumers never see these.

# Warnings are errors on our code only; third-party headers come in as SYSTEM.
add_library(zshard_dev_flags INTERFACE)
# -Wmissing-field-initializers is off because g++ 12 fires it on designated initializers that
# leave members at their defaults, which is how zshard's config aggregates are meant to be used.
target_compile_options(zshard_dev_flags INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Werror -Wpedantic -Wno-missing-field-initializers>)

# Sanitizers: ZSHARD_SANITIZE=address,undefined or thread (set by the presets).
set(ZSHARD_SANITIZE "" CACHE STRING "Sanitizers for zshard's own targets, e.g. address,undefined or thread")
if(ZSHARD_SANITIZE)
  target_compile_options(zshard_dev_flags INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=${ZSHARD_SANITIZE} -fno-omit-frame-pointer -fno-sanitize-recover=all>)
  target_link_options(zshard_dev_flags INTERFACE -fsanitize=${ZSHARD_SANITIZE})
endif()

find_package(Eigen3 3.4 REQUIRED NO_MODULE)
if(ZSHARD_BUILD_TESTS)
  find_package(doctest REQUIRED)
endif()

# CUDA is optional: AUTO enables it when a CUDA compiler is found.
set(ZSHARD_WITH_CUDA OFF)
if(NOT ZSHARD_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    enable_language(CUDA)
    set(ZSHARD_WITH_CUDA ON)
  elseif(ZSHARD_CUDA STREQUAL "ON")
    message(FATAL_ERROR "ZSHARD_CUDA=ON but no CUDA compiler was found (set CMAKE_CUDA_COMPILER)")
  endif()
endif()
message(STATUS "zshard: CUDA targets ${ZSHARD_WITH_CUDA}")

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
