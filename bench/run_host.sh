#!/usr/bin/env bash
# Runs every host bench that is built in $BUILD_DIR (default build/ci) and prints, at the end,
# every key figure they print, as `name: value` lines (the benches' own lines, unchanged).
#   bash bench/run_host.sh [--quick]
# Each bench's full output goes to stdout as it runs. comm_bandwidth re-launches itself under
# mpiexec for its MPI rows when it was built with MPI (ZSHARD_WITH_MPI), so it runs as is here.
# A bench that is not built is reported as skipped; one that fails is reported and the others
# still run (the exit status is then 1). No figure is made up for a bench that prints none.
set -u
quick=""
for arg in "$@"; do
  case "$arg" in
    --quick) quick="--quick" ;;
    *) echo "usage: bash bench/run_host.sh [--quick]   (build folder: \$BUILD_DIR, default build/ci)" >&2; exit 2 ;;
  esac
done
build_dir="${BUILD_DIR:-build/ci}"
bench_dir="$build_dir/bench"
if [ ! -d "$bench_dir" ]; then
  echo "run_host.sh: no $bench_dir; build the benches first (cmake --preset ci && cmake --build build/ci)" >&2
  exit 2
fi

# name and arguments of each host bench (checkpoint_io has no --quick: fewer parameters instead)
benches=("host_adam $quick" "comm_bandwidth $quick" "example_throughput $quick" "offload_tiers $quick"
         "engine_overhead $quick")
if [ -n "$quick" ]; then benches+=("checkpoint_io --params-m 4 --repeats 2"); else benches+=("checkpoint_io"); fi

figures=""
status=0
for entry in "${benches[@]}"; do
  read -r name args <<<"$entry"
  exe="$bench_dir/$name"
  if [ ! -x "$exe" ]; then
    echo "== $name: not built in $build_dir, skipped"
    continue
  fi
  echo "== $name $args"
  # shellcheck disable=SC2086  # args are words on purpose
  if ! out=$("$exe" $args 2>&1); then
    echo "$out"
    echo "== $name failed" >&2
    status=1
    continue
  fi
  echo "$out"
  # key figures: `name: value` lines, a snake_case name at the start of the line
  figures+=$(grep -E '^[a-z][a-z0-9_]*: ' <<<"$out")$'\n'
done

echo "== key figures ($(date -u '+%Y-%m-%d %H:%M UTC'))"
printf '%s' "$figures"
exit "$status"
