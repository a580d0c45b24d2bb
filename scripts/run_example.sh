#!/usr/bin/env bash
# The main job: set-up, build, then train the example GPT with zshard on 4 thread ranks (host
# backend) on the built-in synthetic corpus. Extra arguments go to the trainer (try --help).
#   scripts/run_example.sh [trainer options]            thread ranks (--ranks N, default 4)
#   scripts/run_example.sh --mpi N [trainer options]    N MPI processes, started with mpirun
# Both give the same losses bit for bit ("final loss bits" line).
set -euo pipefail
cd "$(dirname "$0")/.."
mpi_ranks=""
if [ "${1:-}" = "--mpi" ]; then
  [[ "${2:-}" =~ ^[1-9][0-9]*$ ]] || { echo "usage: $0 --mpi N [trainer options]" >&2; exit 2; }
  mpi_ranks=$2
  shift 2
fi
bash scripts/setup.sh
cmake --preset dev >/dev/null
cmake --build --preset dev -j "$(nproc)" --target 02_train_gpt
if [ -z "$mpi_ranks" ]; then
  exec ./build/dev/examples/02_train_gpt "$@"
fi
# Open MPI: start more processes than cores (--oversubscribe) and, in containers run as root,
# say so (--allow-run-as-root). Other MPIs take plain `mpirun -n N`.
launcher=(mpirun -n "$mpi_ranks")
if mpirun --version 2>/dev/null | grep -q "Open MPI"; then
  launcher+=(--oversubscribe)
  [ "$(id -u)" -eq 0 ] && launcher+=(--allow-run-as-root)
fi
exec "${launcher[@]}" ./build/dev/examples/02_train_gpt --mpi "$@"
