#!/usr/bin/env bash
# On a GPU machine: build the GPU tests and bench, run the tests (kernels against the host
# reference, the CUDA backend, NCCL, and the engine's equivalence tests on cuda_backend +
# nccl_comm; NCCL bootstrapped over MPI, one process per GPU, when Open MPI is there), then the bench, which prints its tables and key figures. Within 8 minutes on
# one H200 (about 1 minute of it building).
#
#   bash bench/gpu/run.sh [--quick]
#
# Environment: CUDA_HOME (default /usr/local/cuda), BUILD_DIR (default build/gpu), RESULTS_DIR
# (optional: logs are copied there).
# Needs nvcc, NCCL (CUDA's own, the system's, or the nvidia-nccl-cu13 Python wheel) and, for
# the tests, doctest's header (installed, or copied to .gpu_deps/doctest/doctest.h; without it
# the tests are reported as not run). It calls nvcc directly rather than CMake because a GPU
# machine may lack the Eigen/doctest packages CMake's configure requires for the host targets.
set -uo pipefail
cd "$(dirname "$0")/../.."
quick=""
[[ "${1:-}" == "--quick" ]] && quick="--quick"
cuda=${CUDA_HOME:-/usr/local/cuda}
nvcc=$cuda/bin/nvcc
out=${BUILD_DIR:-build/gpu}
mkdir -p "$out"
t0=$SECONDS
say() { echo "run.sh [$((SECONDS - t0))s] $*"; }

gpu=$(nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader 2>/dev/null | head -1)
say "$(date -u +%Y-%m-%dT%H:%MZ) GPU: ${gpu:-none visible to nvidia-smi}; $("$nvcc" --version | tail -1)"

# ---- NCCL -------------------------------------------------------------------------------------
nccl_inc="" nccl_lib=""
wheel=$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null || true)
for root in "$cuda" /usr /usr/local ${wheel:+"$wheel"}; do
  [[ -f $root/include/nccl.h ]] || continue
  for dir in "$root/lib64" "$root/lib" "$root/lib/x86_64-linux-gnu" /usr/lib/x86_64-linux-gnu; do
    for name in libnccl.so libnccl.so.2; do
      if [[ -e $dir/$name ]]; then nccl_inc=$root/include nccl_lib=$dir/$name; break 3; fi
    done
  done
done
if [[ -z $nccl_lib ]]; then say "NCCL not found (nccl.h + libnccl): cannot build"; exit 2; fi
say "NCCL: $nccl_inc, $nccl_lib"

# ---- doctest (tests only) ---------------------------------------------------------------------
doctest_inc=""
for d in /usr/include /usr/local/include .gpu_deps; do
  [[ -f $d/doctest/doctest.h ]] && { doctest_inc=$d; break; }
done

# ---- build: sm_90 machine code + PTX, plus this GPU's own architecture if it is another -----
arch=(-gencode "arch=compute_90,code=[sm_90,compute_90]")
cap=$(echo "$gpu" | awk -F', ' '{print $2}' | tr -d '.')
[[ -n $cap && $cap != 90 ]] && arch+=(-gencode "arch=compute_$cap,code=sm_$cap")
flags=(-std=c++20 -O3 "${arch[@]}" -Xcompiler=-Wall,-Wextra,-Wno-missing-field-initializers -diag-suppress=554
  -Iinclude "-I$nccl_inc")
libs=("$nccl_lib" "-Xlinker=-rpath,$(dirname "$nccl_lib")")
say "building bench_gpu, 03_gpu_engine${doctest_inc:+ and test_cuda} with nvcc"
build() {  # build <source> <program> [extra flags...]
  local src=$1 prog=$2
  shift 2
  "$nvcc" "${flags[@]}" "$@" "$src" -o "$out/$prog" "${libs[@]}" >"$out/build_$prog.log" 2>&1 ||
    { cat "$out/build_$prog.log"; return 1; }
}
pids=()
build bench/gpu/bench_gpu.cu bench_gpu & pids+=($!)
build examples/03_gpu_engine.cu 03_gpu_engine & pids+=($!)
[[ -n $doctest_inc ]] && { build tests/gpu/test_cuda.cu test_cuda "-I$doctest_inc" & pids+=($!); }
build_ok=1
for p in "${pids[@]}"; do wait "$p" || build_ok=0; done
((build_ok)) || { say "build failed"; exit 3; }
say "built"

# ---- tests ------------------------------------------------------------------------------------
tests="not run (no doctest header: copy /usr/include/doctest to .gpu_deps/doctest and carry it)"
if [[ -n $doctest_inc ]]; then
  timeout 300 "$out/test_cuda" --test-case-exclude='hang*' 2>&1 | tee "$out/test_cuda.log"
  rc_main=${PIPESTATUS[0]}
  timeout 120 "$out/test_cuda" --test-case='hang*' 2>&1 | tee "$out/test_cuda_hang.log"
  rc_hang=${PIPESTATUS[0]}
  tests="test_cuda rc=$rc_main, test_cuda_hang rc=$rc_hang (0 passed, 77 skipped, 124 timed out)"
fi
say "tests: $tests"
timeout 60 "$out/03_gpu_engine" 10 2>&1 | tee "$out/example.log"
rc_example=${PIPESTATUS[0]}
say "example 03_gpu_engine rc=$rc_example"

# ---- NCCL over MPI: one process per GPU (comm/nccl_mpi.hpp) -----------------------------------
nccl_mpi="not run (no mpicxx/mpirun: apt-get install libopenmpi-dev openmpi-bin)"
rc_nccl_mpi=0
if command -v mpicxx >/dev/null && command -v mpirun >/dev/null; then
  ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
  mpi_flags=()
  if mpirun --version 2>/dev/null | grep -q "Open MPI"; then
    mpi_flags+=(--oversubscribe)
    [[ $(id -u) -eq 0 ]] && mpi_flags+=(--allow-run-as-root)
  fi
  if mpicxx -std=c++20 -O2 -Iinclude "-I$cuda/include" "-I$nccl_inc" tests/gpu/test_nccl_mpi.cpp \
       -o "$out/test_nccl_mpi" "-L$cuda/lib64" -lcudart "$nccl_lib" "-Wl,-rpath,$(dirname "$nccl_lib")" \
       >"$out/build_test_nccl_mpi.log" 2>&1; then
    timeout 120 mpirun -n "$((ngpu > 0 ? ngpu : 1))" "${mpi_flags[@]}" "$out/test_nccl_mpi" 2>&1 |
      tee "$out/test_nccl_mpi.log"
    rc_nccl_mpi=${PIPESTATUS[0]}
    nccl_mpi="rc=$rc_nccl_mpi with $((ngpu > 0 ? ngpu : 1)) process(es)"
  else
    cat "$out/build_test_nccl_mpi.log"
    nccl_mpi="build failed"
    rc_nccl_mpi=3
  fi
fi
say "NCCL over MPI (test_nccl_mpi): $nccl_mpi"

# ---- bench ------------------------------------------------------------------------------------
timeout 360 "$out/bench_gpu" $quick 2>&1 | tee "$out/bench_gpu.log"
rc_bench=${PIPESTATUS[0]}
say "bench rc=$rc_bench; total $((SECONDS - t0)) s"
[[ -n ${RESULTS_DIR:-} ]] && mkdir -p "$RESULTS_DIR" && cp "$out"/*.log "$RESULTS_DIR"/ 2>/dev/null
[[ $tests == test_cuda\ rc=0,\ test_cuda_hang\ rc=0* && $rc_example == 0 && $rc_bench == 0 && $rc_nccl_mpi == 0 ]]
