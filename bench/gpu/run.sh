#!/usr/bin/env bash
# On a GPU machine: build the GPU tests, the examples and the bench, run the tests (kernels
# against the host reference, the CUDA backend, NCCL, the engine on cuda_backend + nccl_comm,
# the readiness cases, the example GPT against the host run; NCCL bootstrapped over MPI, one
# process per GPU, when Open MPI is there), the two examples (the toy engine, and the GPT:
# small, then GPT-2 small), PyTorch's run of the same GPT (bench/gpu/torch_reference.py, eager
# and torch.compile) when `import torch` works, then the bench, which prints its tables and key
# figures, the PyTorch ratios from this run's reference only; and compute-sanitizer's memcheck
# on the GPT example and racecheck on the fused attention. The whole script fits in one
# device command of 540 s (a session has 15 minutes of device time): every stage has a time
# budget, printed before it runs, and is cut short to what is left of the total.
#
#   bash bench/gpu/run.sh [--quick]
#
# Exit status: 0 when every stage ran and passed. When nvidia-smi sees a GPU, a stage that does
# not run (a program that finds no CUDA device and exits 77, a missing doctest header, a stage
# cut at its budget) fails the script loudly; the summary's last lines name each such stage.
# Optional, reported but never failing: NCCL over MPI (needs Open MPI), the PyTorch reference
# (needs torch; torch.compile only when it compiles within its budget) and racecheck cut at its
# budget (racecheck that finds a hazard fails).
#
# Environment: CUDA_HOME (default /usr/local/cuda), BUILD_DIR (default build/gpu), OUT or
# RESULTS_DIR (the results folder: every log is written there as it is produced, so a run cut
# short still leaves what it had; default: BUILD_DIR; figures.txt collects the key figures),
# ZSHARD_GPU_BUDGET_S (total, default 520), ZSHARD_GPU_BUILD_S (the build's cap, default 180:
# nvcc on a many-core GPU machine takes ~60-90 s), PYTHON (default python3: the interpreter
# with torch).
# Needs nvcc, cuBLAS (CUDA's), NCCL (CUDA's own, the system's, or the nvidia-nccl-cu* Python
# wheel's folder) and, for the tests, doctest's header (installed, or in .gpu_deps/doctest/)
# and Eigen's headers for the GPT test's host reference (installed, or in .gpu_deps/eigen3/;
# without them that comparison is reported as not made). bench/gpu/prepare_deps.sh copies both
# into .gpu_deps on a machine that has them. It calls nvcc directly rather than CMake because a
# GPU machine may lack the packages CMake's configure requires for the host targets. Without a
# GPU it still builds everything, then reports each GPU stage as skipped (exit 0).
set -uo pipefail
cd "$(dirname "$0")/../.."
quick=""
[[ "${1:-}" == "--quick" ]] && quick="--quick"
cuda=${CUDA_HOME:-/usr/local/cuda}
nvcc=$cuda/bin/nvcc
out=${BUILD_DIR:-build/gpu}
results=${OUT:-${RESULTS_DIR:-$out}}
mkdir -p "$out" "$results"
total=${ZSHARD_GPU_BUDGET_S:-520}
python=${PYTHON:-python3}
t0=$SECONDS
summary="$results/run_summary.log"
: >"$summary"
rm -f "$results"/torch_*.log  # a ratio is only ever taken from this run's reference
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

say "plan: build <= ${ZSHARD_GPU_BUILD_S:-180} s, test_cuda <= 150 s, hang test <= 40 s, examples <= 25 + 30 s, compute-sanitizer memcheck <= 60 s and racecheck <= 45 s, GPT-2 small <= 45 s, bench kernels+engine <= 90 s, PyTorch eager <= 60 s and torch.compile <= 120 s, bench gpt and nccl+overlap <= the rest (total ${total} s; each stage cut to what is left after the later ones' reserve)"
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

# ---- doctest (tests only), Eigen (the GPT test's host reference) -------------------------------
doctest_inc="" eigen_inc=""
for d in /usr/include /usr/local/include .gpu_deps; do
  [[ -f $d/doctest/doctest.h ]] && { doctest_inc=$d; break; }
done
for d in /usr/include/eigen3 /usr/local/include/eigen3 .gpu_deps/eigen3; do
  [[ -f $d/Eigen/Dense ]] && { eigen_inc=$d; break; }
done
say "doctest: ${doctest_inc:-not found}; Eigen: ${eigen_inc:-not found (the GPT test compares with the host emulation only)}"

# ---- build: sm_90 machine code + PTX, plus this GPU's own architecture if it is another -----
arch=(-gencode "arch=compute_90,code=[sm_90,compute_90]")
cap=$(echo "$gpu" | awk -F', ' '{print $2}' | tr -d '.')
[[ -n $cap && $cap != 90 ]] && arch+=(-gencode "arch=compute_$cap,code=sm_$cap")
flags=(-std=c++20 -O3 "${arch[@]}" -Xcompiler=-Wall,-Wextra,-Wno-missing-field-initializers -diag-suppress=554
  -Iinclude "-I$nccl_inc")
libs=("$nccl_lib" "-Xlinker=-rpath,$(dirname "$nccl_lib")" "-L$cuda/lib64" -lcublas)
build_secs=$(budget "${ZSHARD_GPU_BUILD_S:-180}" 300)
say "stage build: budget ${build_secs} s: objects in parallel (the GPT kernels once), then links"
compile() {  # compile <source> <object> [extra flags...]; the log goes straight to the results folder
  local src=$1 obj=$2
  shift 2
  timeout -k 5 "$build_secs" "$nvcc" "${flags[@]}" "$@" -c "$src" -o "$out/$obj" >"$results/build_$obj.log" 2>&1 ||
    { tail -50 "$results/build_$obj.log"; return 1; }
}
link() {  # link <program> <objects...>
  local prog=$1
  shift
  "$nvcc" "${flags[@]}" "${@/#/$out/}" -o "$out/$prog" "${libs[@]}" >"$results/build_$prog.log" 2>&1 ||
    { tail -50 "$results/build_$prog.log"; return 1; }
}
build_start=$SECONDS
pids=()
compile examples/gpt/cuda/cuda_ops.cu gpt_cuda_ops.o & pids+=($!)
compile bench/gpu/bench_gpu.cu bench_gpu.o & pids+=($!)
compile examples/03_gpu_engine.cu 03_gpu_engine.o & pids+=($!)
compile examples/05_train_gpt_gpu.cu 05_train_gpt_gpu.o & pids+=($!)
if [[ -n $doctest_inc ]]; then
  compile tests/gpu/test_cuda.cu test_cuda.o "-I$doctest_inc" & pids+=($!)
  # host C++ (nvcc hands a .cpp to the host compiler): Eigen stays out of nvcc's front end
  compile tests/gpu/gpt_host_reference.cpp gpt_host_reference.o ${eigen_inc:+"-isystem=$eigen_inc"} & pids+=($!)
fi
build_ok=1
for p in "${pids[@]}"; do wait "$p" || build_ok=0; done
if ((build_ok)); then
  link bench_gpu bench_gpu.o gpt_cuda_ops.o || build_ok=0
  link 03_gpu_engine 03_gpu_engine.o || build_ok=0
  link 05_train_gpt_gpu 05_train_gpt_gpu.o gpt_cuda_ops.o || build_ok=0
  [[ -n $doctest_inc ]] && { link test_cuda test_cuda.o gpt_host_reference.o gpt_cuda_ops.o || build_ok=0; }
fi
((build_ok)) || { say "build failed (logs: $results/build_*.log)"; exit 3; }
say "built in $((SECONDS - build_start)) s"

# Reductions on a second communicator (the readiness tests, the bench's hand schedule) put two
# communicators per GPU in flight: NCCL must then launch in the order of the host's calls.
export NCCL_LAUNCH_ORDER_IMPLICIT=1
say "NCCL_LAUNCH_ORDER_IMPLICIT=1 (two communicators per GPU in flight)"

# ---- what ran: a stage that should have run and did not fails the script when a GPU is there ----
failed=() not_run=()
# verdict <stage> <rc> [what 77 means]: 0 passed; 77 the program found no CUDA device; else failed.
verdict() {
  local name=$1 rc=$2
  case $rc in
    0) ;;
    77) if ((have_gpu)); then failed+=("$name (found no CUDA device although nvidia-smi sees '$gpu')"); fi ;;
    124 | 137) failed+=("$name (cut at its budget)") ;;
    *) failed+=("$name (rc $rc)") ;;
  esac
}

# ---- tests ------------------------------------------------------------------------------------
tests="not run (no doctest header: bash bench/gpu/prepare_deps.sh, then carry .gpu_deps)"
if [[ -n $doctest_inc ]]; then
  run_stage test_cuda "$(budget 150 280)" "$out/test_cuda" --test-case-exclude='hang*'
  rc_main=$?
  verdict test_cuda $rc_main
  if ((have_gpu)); then
    run_stage test_cuda_hang "$(budget 40 260)" "$out/test_cuda" --test-case='hang*'
    rc_hang=$?
    verdict test_cuda_hang $rc_hang
  else
    rc_hang=77
    say "stage test_cuda_hang: skipped (no GPU)"
  fi
  tests="test_cuda rc=$rc_main, test_cuda_hang rc=$rc_hang (0 passed, 77 skipped, 124 cut at its budget)"
elif ((have_gpu)); then
  failed+=("test_cuda, test_cuda_hang (not built: no doctest header; bash bench/gpu/prepare_deps.sh, then carry .gpu_deps)")
fi
say "tests: $tests"

# ---- NCCL over MPI: one process per GPU (comm/nccl_mpi.hpp); optional (needs Open MPI) --------------
nccl_mpi="not run (no mpicxx/mpirun: apt-get install libopenmpi-dev openmpi-bin)"
if ((have_gpu)) && command -v mpicxx >/dev/null && command -v mpirun >/dev/null; then
  ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
  mpi_flags=()
  if mpirun --version 2>/dev/null | grep -q "Open MPI"; then
    mpi_flags+=(--oversubscribe)
    [[ $(id -u) -eq 0 ]] && mpi_flags+=(--allow-run-as-root)
  fi
  if timeout "$(budget 60 240)" mpicxx -std=c++20 -O2 -Iinclude "-I$cuda/include" "-I$nccl_inc" \
       tests/gpu/test_nccl_mpi.cpp -o "$out/test_nccl_mpi" "-L$cuda/lib64" -lcudart "$nccl_lib" \
       "-Wl,-rpath,$(dirname "$nccl_lib")" >"$results/build_test_nccl_mpi.log" 2>&1; then
    run_stage test_nccl_mpi "$(budget 40 230)" mpirun -n "$((ngpu > 0 ? ngpu : 1))" "${mpi_flags[@]}" \
      "$out/test_nccl_mpi"
    rc=$?
    verdict test_nccl_mpi $rc
    nccl_mpi="rc=$rc with $((ngpu > 0 ? ngpu : 1)) process(es)"
  else
    nccl_mpi="build failed (log: $results/build_test_nccl_mpi.log)"
    failed+=("test_nccl_mpi (build failed)")
  fi
elif ((have_gpu)); then
  not_run+=("test_nccl_mpi: no mpicxx/mpirun here (optional)")
else
  nccl_mpi="skipped (no GPU)"
fi
say "NCCL over MPI (test_nccl_mpi): $nccl_mpi"

# ---- examples, PyTorch and the bench: GPU only -----------------------------------------------------
torch_refs=()
if ((have_gpu)); then
  run_stage example "$(budget 25 220)" "$out/03_gpu_engine" 10
  rc=$?
  verdict 03_gpu_engine $rc
  say "example 03_gpu_engine rc=$rc"
  # 'used' counts from what the GPU used before the process (its CUDA context included)
  used_mib() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 2>/dev/null | head -1 | tr -d ' '; }
  base=$(used_mib)
  run_stage gpt_small "$(budget 30 200)" "$out/05_train_gpt_gpu" --steps 100 --log-every 20 ${base:+--baseline-used-mib "$base"}
  rc_small=$?
  verdict "05_train_gpt_gpu (small)" $rc_small
  # compute-sanitizer: memcheck on the GPT example (a small model, sequences of 96: a full and a
  # partial attention tile), racecheck on the fused attention's shared memory through its
  # kernel test (optional: the slowest tool, not to fail the run by its budget alone).
  sanitizer=$cuda/bin/compute-sanitizer
  if [[ -x $sanitizer ]]; then
    run_stage memcheck_gpt "$(budget 60 170)" "$sanitizer" --tool memcheck --leak-check no --error-exitcode 9 \
      "$out/05_train_gpt_gpu" --steps 2 --log-every 1 --seq 96 --eval-every 1
    verdict "compute-sanitizer memcheck (05_train_gpt_gpu)" $?
    if [[ -n $doctest_inc ]]; then
      run_stage racecheck_attention "$(budget 45 140)" "$sanitizer" --tool racecheck --error-exitcode 9 \
        "$out/test_cuda" --test-case='*fused attention*'
      rc=$?
      if ((rc == 124 || rc == 137)); then not_run+=("racecheck of the fused attention: cut at its budget (optional)")
      else verdict "compute-sanitizer racecheck (fused attention)" $rc; fi
    fi
  else
    failed+=("compute-sanitizer memcheck (05_train_gpt_gpu): $sanitizer not found")
  fi
  base=$(used_mib)
  run_stage gpt2_small "$(budget 45 110)" "$out/05_train_gpt_gpu" --gpt2-small --steps 30 --log-every 5 \
    ${base:+--baseline-used-mib "$base"}
  rc_gpt2=$?
  verdict "05_train_gpt_gpu (GPT-2 small)" $rc_gpt2
  say "example 05_train_gpt_gpu rc=$rc_small (small), rc=$rc_gpt2 (GPT-2 small)"
  # Separate runs, each with its own figures, so a run cut at its budget loses only its own.
  run_stage bench_engine "$(budget 90 100)" "$out/bench_gpu" $quick --stages kernels,engine
  rc=$?
  verdict "bench_gpu (kernels, engine)" $rc
  # PyTorch's run of the bench's GPT (same shape and batch, this GPU), eager then torch.compile.
  if timeout 60 "$python" -c "import torch" >"$results/torch_import.log" 2>&1; then
    shape=(--vocab 50304 --seq 1024 --d-model 768 --heads 12 --layers 12 --d-ff 3072 --batch 8)
    run_stage torch_eager "$(budget 60 70)" "$python" bench/gpu/torch_reference.py --mode eager "${shape[@]}"
    rc=$?
    verdict "PyTorch eager reference" $rc
    ((rc == 0)) && torch_refs+=(--torch-ref "$results/torch_eager.log")
    run_stage torch_compile "$(budget 120 70)" "$python" bench/gpu/torch_reference.py --mode compile "${shape[@]}"
    rc=$?
    if ((rc == 0)); then
      torch_refs+=(--torch-ref "$results/torch_compile.log")
    elif ((rc == 124 || rc == 137)); then
      not_run+=("torch.compile reference: did not compile and run within its budget (no gpu_gpt_vs_torch_compile)")
    else
      verdict "torch.compile reference" $rc
    fi
  else
    not_run+=("PyTorch reference: '$python -c \"import torch\"' fails here (no gpu_gpt_vs_pytorch_eager; $results/torch_import.log)")
  fi
  run_stage bench_gpt "$(budget 120 25)" "$out/bench_gpu" $quick --stages gpt "${torch_refs[@]}"
  rc=$?
  verdict "bench_gpu (gpt)" $rc
  run_stage bench_comm "$(budget 120 5)" "$out/bench_gpu" $quick --stages nccl,overlap
  rc=$?
  verdict "bench_gpu (nccl, overlap)" $rc
  say "bench done; total $((SECONDS - t0)) s"
else
  say "stage example, gpt_small, gpt2_small: skipped (no GPU)"
  say "stage bench_engine, torch_eager, torch_compile, bench_gpt, bench_comm: skipped (no GPU); total $((SECONDS - t0)) s"
fi

# ---- the key figures, in one file -----------------------------------------------------------------
{
  echo "# $(date -u +%Y-%m-%dT%H:%MZ) ${gpu:-no GPU}; nvcc ${nvcc_version:-?}; NCCL ${nccl_version:-?}"
  echo "# tests: $tests; NCCL over MPI: $nccl_mpi"
  for f in gpt_small memcheck_gpt racecheck_attention gpt2_small bench_engine torch_eager torch_compile bench_gpt bench_comm; do
    [[ -f $results/$f.log ]] || continue
    echo "## $f"
    grep -E '^[a-z_0-9]+: [-0-9.]+' "$results/$f.log" || true
    grep -E '^# no |ERROR SUMMARY|RACECHECK SUMMARY' "$results/$f.log" || true
  done
} >"$results/figures.txt"
say "figures: $results/figures.txt"
for n in "${not_run[@]}"; do say "NOT RUN (optional): $n"; done
if ((${#failed[@]})); then
  for f in "${failed[@]}"; do say "FAILED: $f"; done
  say "run.sh: ${#failed[@]} stage(s) failed or did not run on ${gpu:-this machine}"
  exit 1
fi
say "run.sh: every stage passed${gpu:+ on $gpu}"
