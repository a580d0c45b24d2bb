# Settings for zshard's own targets (tests, benches, examples). Consumers never see these.

# Warnings on our code only; third-party headers come in as SYSTEM. They become errors only
# when asked (the presets and CI do): a plain `cmake -B build` with another compiler version or
# build type must build, whatever new warnings it prints.
option(ZSHARD_WARNINGS_AS_ERRORS "Turn warnings into errors on zshard's own targets (the presets and CI do)" OFF)
add_library(zshard_dev_flags INTERFACE)
# -Wmissing-field-initializers is off because g++ 12 fires it on designated initializers that
# leave members at their defaults, which is how zshard's config aggregates are meant to be used.
target_compile_options(zshard_dev_flags INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wno-missing-field-initializers>)
# g++ before 12.3 at -O3 reports -Wrestrict false positives inside libstdc++'s
# operator+(const char*, std::string&&) wherever a name is built in a loop ("p" +
# std::to_string(i)), after inlining, at a line of libstdc++'s (GCC bug 105329). Every file that
# builds names raised it somewhere (tests, examples, tools): off for that compiler alone, so
# the ci step can build with the plain Release flags and warnings as errors.
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 12.3)
  target_compile_options(zshard_dev_flags INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-Wno-restrict>)
endif()
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
if(NOT ZSHARD_WITH_JSON)
  message(FATAL_ERROR "zshard's tests and tools need nlohmann-json (Debian: nlohmann-json3-dev; scripts/setup.sh installs it)")
endif()
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
  # The example GPT's kernels and cuBLAS matmuls (examples/gpt/cuda/cuda_ops.cu): one nvcc
  # translation unit, behind a plain C++ header, linked by the GPU example, bench_gpu and test_cuda.
  add_library(zshard_gpt_cuda_ops STATIC ${PROJECT_SOURCE_DIR}/examples/gpt/cuda/cuda_ops.cu)
  target_link_libraries(zshard_gpt_cuda_ops PUBLIC zshard::zshard zshard_cuda_flags CUDA::cublas)
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

# Each test program is compiled as one translation unit (a unity build): its files share the
# heavy headers (the engine, doctest), and one unit parses them and instantiates the engine's
# templates once instead of once per file, which roughly halves the tests' compile time. A test
# file keeps its helpers in an anonymous namespace under names no other file of its program
# uses. Off: each file alone (quicker to rebuild one edited file).
option(ZSHARD_UNITY_TESTS "Compile each test program as one translation unit" ON)
# The test programs' optimisation, after the build type's flags (empty: the build type's). Four
# fifths of a test program's compile time is the optimiser's; -Og takes half of -O2's time and
# runs the tests about as fast, while the benches and examples keep the build type's flags. CI
# leaves it empty: the ci step builds with the plain step's flags so that the plain step's
# objects come from the compiler cache (scripts/test.sh), and the sanitizer presets are -Og.
set(ZSHARD_TEST_OPTIMIZATION "" CACHE STRING "Optimisation flag for the test programs only, e.g. -Og (empty: the build type's)")
function(zshard_test_program target)
  if(ZSHARD_UNITY_TESTS)
    set_target_properties(${target} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 0)
  endif()
  if(ZSHARD_TEST_OPTIMIZATION)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${ZSHARD_TEST_OPTIMIZATION}>)
  endif()
endfunction()

# zshard_add_test(NAME <name> SOURCES <files...> LABELS <labels...> [NO_THREADS] [DEFINITIONS <defs...>])
# A program of several files is one ctest test per file, `<name>:<file stem>`, each running the
# test cases of its file (doctest's --source-file): ctest -j then spreads one long program over
# the cores (test_checkpoint alone took 277 s of the 313 s TSan run while a core idled). The
# tests are listed from SOURCES, so every file's cases run and none twice; one whose filter
# selects no test case fails (a renamed path must not pass by running nothing).
# NO_THREADS: the program starts no thread (checked with strace: no clone), so ThreadSanitizer
# has nothing to check in it and the tsan preset does not build it; every other build runs it.
function(zshard_add_test)
  cmake_parse_arguments(ARG "NO_THREADS" "NAME;TIMEOUT" "SOURCES;LABELS;LIBS;DEFINITIONS" ${ARGN})
  if(ARG_NO_THREADS AND ZSHARD_SANITIZE MATCHES "thread")
    return()
  endif()
  add_executable(${ARG_NAME} ${ARG_SOURCES} $<TARGET_OBJECTS:zshard_doctest_main>)
  target_link_libraries(${ARG_NAME} PRIVATE zshard::zshard zshard_dev_flags doctest::doctest ${ARG_LIBS})
  target_compile_definitions(${ARG_NAME} PRIVATE ${ARG_DEFINITIONS})
  zshard_test_program(${ARG_NAME})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 600)
  endif()
  list(LENGTH ARG_SOURCES file_count)
  if(file_count EQUAL 1)
    add_test(NAME ${ARG_NAME} COMMAND ${ARG_NAME})
    set_tests_properties(${ARG_NAME} PROPERTIES LABELS "${ARG_LABELS}" TIMEOUT ${ARG_TIMEOUT})
    return()
  endif()
  foreach(source IN LISTS ARG_SOURCES)
    get_filename_component(stem ${source} NAME_WE)
    # The pattern ends in the path under tests/ so that two programs' files of one name differ.
    add_test(NAME ${ARG_NAME}:${stem} COMMAND ${ARG_NAME} --source-file=*/tests/${source})
    set_tests_properties(${ARG_NAME}:${stem} PROPERTIES LABELS "${ARG_LABELS}" TIMEOUT ${ARG_TIMEOUT}
                         FAIL_REGULAR_EXPRESSION "test cases: +0 \\|")
  endforeach()
endfunction()

# ZSHARD_NATIVE: benches and examples target this machine's CPU (see CMakeLists.txt).
add_library(zshard_native_flags INTERFACE)
if(ZSHARD_NATIVE)
  include(CheckCXXCompilerFlag)
  check_cxx_compiler_flag(-march=native ZSHARD_HAVE_MARCH_NATIVE)
  if(ZSHARD_HAVE_MARCH_NATIVE)
    target_compile_options(zshard_native_flags INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-march=native>)
    # GCC before 12.3 reports the placeholder inside AVX-512 intrinsics (_mm512_undefined_*) as
    # (maybe-)uninitialized wherever Eigen inlines them (GCC bug 105593), after inlining, where
    # Eigen's system-header status no longer hides it: a false positive. The tests, built
    # without -march=native, keep both warnings as errors on the same headers.
    if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 12.3)
      target_compile_options(zshard_native_flags INTERFACE
        $<$<COMPILE_LANGUAGE:CXX>:-Wno-uninitialized -Wno-maybe-uninitialized>)
    endif()
    message(STATUS "zshard: examples and benches built for this machine (-march=native; ZSHARD_NATIVE=OFF for portable binaries)")
  else()
    message(STATUS "zshard: the compiler does not take -march=native: examples and benches stay portable")
  endif()
endif()

# zshard_add_program(NAME <name> SOURCES <files...> [LIBS <libs...>] [BENCH]) for benches and
# examples. BENCH: built with NDEBUG in every build type, so a bench times what users ship. With
# assertions on (a Debug or RelWithDebInfo build) the host backend poisons every freed block:
# that memset alone made checkpoint_io's load 0.27 of disk instead of 0.46.
function(zshard_add_program)
  cmake_parse_arguments(ARG "BENCH" "NAME" "SOURCES;LIBS" ${ARGN})
  add_executable(${ARG_NAME} ${ARG_SOURCES})
  target_link_libraries(${ARG_NAME} PRIVATE zshard::zshard zshard_dev_flags zshard_native_flags ${ARG_LIBS})
  if(ARG_BENCH)
    target_compile_definitions(${ARG_NAME} PRIVATE NDEBUG)
  endif()
endfunction()

# MPI is optional: the MPI communicator's tests, the example's --mpi mode and the bench's MPI
# rows build whenever it is found (Debian: libopenmpi-dev openmpi-bin), and are skipped, with a
# message, when it is not. Only MPI's C API is used (MPI_CXX_SKIP_MPICXX: no C++ bindings).
set(ZSHARD_WITH_MPI OFF)
set(MPI_CXX_SKIP_MPICXX ON CACHE BOOL "zshard uses MPI's C API only")
find_package(MPI COMPONENTS CXX QUIET)
if(MPI_CXX_FOUND AND MPIEXEC_EXECUTABLE)
  set(ZSHARD_WITH_MPI ON)
  # Open MPI needs --oversubscribe to start more processes than cores (CI has 2), and refuses
  # to run as root unless told (containers): both are said here once for every launch.
  set(ZSHARD_MPIEXEC_FLAGS "")
  set(ZSHARD_MPI_ENV "")
  execute_process(COMMAND ${MPIEXEC_EXECUTABLE} --version OUTPUT_VARIABLE _zshard_mpiexec_version ERROR_QUIET)
  if(_zshard_mpiexec_version MATCHES "Open MPI|OpenRTE")
    list(APPEND ZSHARD_MPIEXEC_FLAGS --oversubscribe)
    # shared-memory single copy (CMA) needs ptrace rights that containers often lack: plain copies.
    set(ZSHARD_MPI_ENV OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
                       OMPI_MCA_btl_vader_single_copy_mechanism=none)
  endif()
  message(STATUS "zshard: MPI ${MPI_CXX_VERSION} (${MPIEXEC_EXECUTABLE}): MPI communicator targets on")
else()
  message(STATUS "zshard: MPI not found: MPI communicator tests, 02_train_gpt --mpi and the bench's MPI rows are "
                 "skipped (install libopenmpi-dev and openmpi-bin, scripts/setup.sh does)")
endif()
# OpenMPI's own code makes ASan/TSan report races and leaks that are not ours: its tests run in
# the ci preset only.
set(ZSHARD_MPI_TESTS ${ZSHARD_WITH_MPI})
if(ZSHARD_WITH_MPI AND ZSHARD_SANITIZE)
  set(ZSHARD_MPI_TESTS OFF)
  message(STATUS "zshard: MPI tests skipped under sanitizers (${ZSHARD_SANITIZE}): Open MPI itself produces false "
                 "reports there; they run in the ci preset")
endif()

# zshard_add_mpi_test(NAME <name> TARGET <program> NP <processes> [ARGS <args...>] LABELS <labels...>)
# runs the program under mpiexec with NP processes.
function(zshard_add_mpi_test)
  cmake_parse_arguments(ARG "" "NAME;TARGET;NP;TIMEOUT" "ARGS;LABELS" ${ARGN})
  add_test(NAME ${ARG_NAME}
           COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${ARG_NP} ${ZSHARD_MPIEXEC_FLAGS} ${MPIEXEC_PREFLAGS}
                   $<TARGET_FILE:${ARG_TARGET}> ${MPIEXEC_POSTFLAGS} ${ARG_ARGS})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  set_tests_properties(${ARG_NAME} PROPERTIES LABELS "${ARG_LABELS}" TIMEOUT ${ARG_TIMEOUT} PROCESSORS ${ARG_NP}
                                              ENVIRONMENT "${ZSHARD_MPI_ENV}")
endfunction()
