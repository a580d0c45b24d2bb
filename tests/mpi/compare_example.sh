#!/usr/bin/env bash
# The main job on MPI processes gives the same final loss, bit for bit, as on thread ranks.
# usage: compare_example.sh <02_train_gpt> <ranks> <mpiexec> [mpiexec flags...]
# Runs a short training both ways and compares the "final loss bits" lines. Exit status 1 of
# the example (loss not yet falling after a few steps) is accepted; anything else fails.
# COMPARE_EXTRA_ARGS (environment, split on spaces) go to both runs, e.g. a DeepSpeed config.
set -u
exe=$1 ranks=$2
shift 2
args=(--steps 3 --layers 2 --d-model 64 --d-ff 128 --seq 32 --batch 4 --eval-every 0 --log-every 1)
# shellcheck disable=SC2206
[ -n "${COMPARE_EXTRA_ARGS:-}" ] && args+=(${COMPARE_EXTRA_ARGS})
threads=$("$exe" --ranks "$ranks" "${args[@]}" 2>&1); t_status=$?
mpi=$("$@" -n "$ranks" "$exe" --mpi "${args[@]}" 2>&1); m_status=$?
t_bits=$(printf '%s\n' "$threads" | grep '^final loss bits:')
m_bits=$(printf '%s\n' "$mpi" | grep '^final loss bits:')
printf '== threads (status %s)\n%s\n== mpi (status %s)\n%s\n' "$t_status" "$threads" "$m_status" "$mpi"
if [ "$t_status" -gt 1 ] || [ "$m_status" -gt 1 ]; then echo "FAIL: a run failed"; exit 1; fi
if [ -z "$t_bits" ] || [ "$t_bits" != "$m_bits" ]; then
  echo "FAIL: threads '$t_bits' vs MPI '$m_bits'"
  exit 1
fi
# the per-step losses printed by rank 0 agree too
if [ "$(printf '%s\n' "$threads" | grep -o 'loss [0-9.]*' )" != "$(printf '%s\n' "$mpi" | grep -o 'loss [0-9.]*')" ]; then
  echo "FAIL: per-step losses differ"
  exit 1
fi
echo "PASS: $t_bits on $ranks thread ranks and $ranks MPI processes"
