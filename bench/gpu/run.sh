#!/usr/bin/env bash
# On a GPU machine: build the GPU tests, the example and the bench, run the tests (kernels
# against the host reference, the CUDA backend, NCCL, the engine on cuda_backend + nccl_comm,
# the readiness cases of issue 18; NCCL bootstrapped over MPI, one process per GPU, when Open
# MPI is there), the example, then the bench, which prints its tables and key figures. The whole
# script fits in 8 minutes (a device command may run 10; a session has 15 minutes of device
# time): every stage has a time budget, printed before it runs, and is cut short to what is left
# of the total.
#
#   bash bench/gpu/run.sh [--quick]
#
# Environment: CUDA_HOME (default /usr/local/cuda), BUILD_DIR (default build/gpu), OUT or
# RESULTS_DIR (the results folder: every log is written there as it is produced, so a run cut
# short still leaves what it had; default: BUILD_DIR), ZSHARD_GPU_BUDGET_S (total, default 470),
# ZSHARD_GPU_BUILD_S (the build's cap, default 180: nvcc on a many-core GPU machine takes ~60 s).
# Needs nvcc, NCCL (CUDA's own, the system's, or the nvidia-nccl-cu* Python wheel's folder) and,
# for the tests, doctest's header (installed, or copied to .gpu_deps/doctest/doctest.h; without
# it the tests are reported as not run). It calls nvcc directly rather than CMake because a GPU
# machine may lack the Eigen/doctest packages CMake's configure requires for the host targets.
# Without a GPU it still builds everything, then reports each GPU stage as skipped (exit 0).
set -uo pipefail
cd "$(dirname "$0")/../.."
quick=""
[[ "${1:-}" == "--quick" ]] && quick="--quick"
cuda=${CUDA_HOME:-/usr/local/cuda}
nvcc=$cuda/bin/nvcc
out=${BUILD_DIR:-build/gpu}
results=${OUT:-${RESULTS_DIR:-$out}}
mkdir -p "$out" "$results"
total=${ZSHARD_GPU_BUDGET_S:-470}
t0=$SECONDS
summary="$results/run_summary.log"
: >"$summary"
say() { echo "run.sh [$((SECONDS - t0))s] $*" | tee -a "$summary"; }
left() { echo $((total - (SECONDS - t0))); }
# budget <cap> <reserve>: seconds a stage may take: its cap, cut to what is left of the total
# after keeping <reserve> for the stages after it.
budget() {
  local cap=$1 reserve=$2 l
  l=$(($(left) - reserve))
  ((l < cap)) && cap=$l
  ((cap < 5)) && cap=5
  echo "$cap"
}
# run_stage <name> <seconds> <command...>: runs with a hard limit, its output streamed to
# $results/<name>.log as it is written; returns the command's status (124: cut at the limit).
run_stage() {
  local name=$1 secs=$2
  shift 2
  say "stage $name: budget ${secs} s ($(left) s left of ${total} s)"
  timeout -k 5 "$secs" "$@" 2>&1 | tee "$results/$name.log"
  return "${PIPESTATUS[0]}"
}

say "plan: build <= ${ZSHARD_GPU_BUILD_S:-180} s, test_cuda <= 150 s, hang test <= 40 s, example <= 30 s, bench <= the rest (total ${total} s)"
gpu=$(nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader 2>/dev/null | head -1)
nvcc_version=$("$nvcc" --version 2>/dev/null | tail -1)
say "$(date -u +%Y-%m-%dT%H:%MZ) GPU: ${gpu:-none visible to nvidia-smi}; nvcc: ${nvcc_version:-not found at $nvcc}"
have_gpu=0
[[ -n $gpu ]] && have_gpu=1

# ---- NCCL: CUDA's, the system's, then the Python wheel's folder (nvidia-nccl-cu*) --------------
nccl_inc="" nccl_lib=""
wheels=()
wheel=$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null || true)
[[ -n $wheel ]] && wheels+=("$wheel")
for site in $(python3 -c 'import site, sys; print(" ".join(site.getsitepackages() + [site.getusersitepackages()]))' 2>/dev/null); do
  [[ -d $site/nvidia/nccl ]] && wheels+=("$site/nvidia/nccl")
done
for root in "$cuda" /usr /usr/local "${wheels[@]}"; do
  [[ -f $root/include/nccl.h ]] || continue
  for dir in "$root/lib64" "$root/lib" "$root/lib/x86_64-linux-gnu" /usr/lib/x86_64-linux-gnu; do
    for name in libnccl.so libnccl.so.2; do
      if [[ -e $dir/$name ]]; then nccl_inc=$root/include nccl_lib=$dir/$name; break 3; fi
    done
  done
done
if [[ -z $nccl_lib ]]; then say "NCCL not found (nccl.h + libnccl; also looked in ${wheels[*]:-no nvidia-nccl wheel}): cannot build"; exit 2; fi
nccl_version=$(awk '/#define NCCL_(MAJOR|MINOR|PATCH) /{v = v (v ? "." : "") $3} END {print v}' "$nccl_inc/nccl.h")
say "NCCL ${nccl_version:-?}: $nccl_inc, $nccl_lib"

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
build_secs=$(budget "${ZSHARD_GPU_BUILD_S:-180}" 200)
say "stage build: budget ${build_secs} s: bench_gpu, 03_gpu_engine${doctest_inc:+ and test_cuda} with nvcc, in parallel"
build() {  # build <source> <program> [extra flags...]; the log goes straight to the results folder
  local src=$1 prog=$2
  shift 2
  timeout -k 5 "$build_secs" "$nvcc" "${flags[@]}" "$@" "$src" -o "$out/$prog" "${libs[@]}" \
    >"$results/build_$prog.log" 2>&1 || { tail -50 "$results/build_$prog.log"; return 1; }
}
pids=()
build bench/gpu/bench_gpu.cu bench_gpu & pids+=($!)
build examples/03_gpu_engine.cu 03_gpu_engine & pids+=($!)
[[ -n $doctest_inc ]] && { build tests/gpu/test_cuda.cu test_cuda "-I$doctest_inc" & pids+=($!); }
build_ok=1
for p in "${pids[@]}"; do wait "$p" || build_ok=0; done
((build_ok)) || { say "build failed (logs: $results/build_*.log)"; exit 3; }
say "built"

# Reductions on a second communicator (the readiness tests, the bench's hand schedule) put two
# communicators per GPU in flight: NCCL must then launch in the order of the host's calls.
export NCCL_LAUNCH_ORDER_IMPLICIT=1
say "NCCL_LAUNCH_ORDER_IMPLICIT=1 (two communicators per GPU in flight)"

# ---- tests ------------------------------------------------------------------------------------
tests="not run (no doctest header: copy /usr/include/doctest to .gpu_deps/doctest and carry it)"
rc_main=0 rc_hang=0
if [[ -n $doctest_inc ]]; then
  run_stage test_cuda "$(budget 150 110)" "$out/test_cuda" --test-case-exclude='hang*'
  rc_main=$?
  if ((have_gpu)); then
    run_stage test_cuda_hang "$(budget 40 70)" "$out/test_cuda" --test-case='hang*'
    rc_hang=$?
  else
    rc_hang=77
    say "stage test_cuda_hang: skipped (no GPU)"
  fi
  tests="test_cuda rc=$rc_main, test_cuda_hang rc=$rc_hang (0 passed, 77 skipped, 124 cut at its budget)"
fi
say "tests: $tests"

# ---- NCCL over MPI: one process per GPU (comm/nccl_mpi.hpp) -----------------------------------
nccl_mpi="not run (no mpicxx/mpirun: apt-get install libopenmpi-dev openmpi-bin)"
rc_nccl_mpi=0
if ((have_gpu)) && command -v mpicxx >/dev/null && command -v mpirun >/dev/null; then
  ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
  mpi_flags=()
  if mpirun --version 2>/dev/null | grep -q "Open MPI"; then
    mpi_flags+=(--oversubscribe)
    [[ $(id -u) -eq 0 ]] && mpi_flags+=(--allow-run-as-root)
  fi
  if timeout "$(budget 60 60)" mpicxx -std=c++20 -O2 -Iinclude "-I$cuda/include" "-I$nccl_inc" \
       tests/gpu/test_nccl_mpi.cpp -o "$out/test_nccl_mpi" "-L$cuda/lib64" -lcudart "$nccl_lib" \
       "-Wl,-rpath,$(dirname "$nccl_lib")" >"$results/build_test_nccl_mpi.log" 2>&1; then
    run_stage test_nccl_mpi "$(budget 40 40)" mpirun -n "$((ngpu > 0 ? ngpu : 1))" "${mpi_flags[@]}" \
      "$out/test_nccl_mpi"
    rc_nccl_mpi=$?
    nccl_mpi="rc=$rc_nccl_mpi with $((ngpu > 0 ? ngpu : 1)) process(es)"
  else
    nccl_mpi="build failed (log: $results/build_test_nccl_mpi.log)"
    rc_nccl_mpi=3
  fi
elif ((!have_gpu)); then
  nccl_mpi="skipped (no GPU)"
fi
say "NCCL over MPI (test_nccl_mpi): $nccl_mpi"

# ---- example and bench: GPU only ----------------------------------------------------------------
if ((have_gpu)); then
  run_stage example "$(budget 30 40)" "$out/03_gpu_engine" 10
  rc_example=$?
  say "example 03_gpu_engine rc=$rc_example"
  run_stage bench_gpu "$(budget 300 5)" "$out/bench_gpu" $quick
  rc_bench=$?
  say "bench rc=$rc_bench; total $((SECONDS - t0)) s"
else
  rc_example=0 rc_bench=0
  say "stage example: skipped (no GPU)"
  say "stage bench_gpu: skipped (no GPU); total $((SECONDS - t0)) s"
fi
ok_rc() { [[ $1 == 0 || ($1 == 77 && $have_gpu == 0) ]]; }
[[ -z $doctest_inc ]] || { ok_rc "$rc_main" && ok_rc "$rc_hang"; } || exit 1
[[ $rc_example == 0 && $rc_bench == 0 && $rc_nccl_mpi == 0 ]]
