#!/usr/bin/env bash
# The main job: set-up, build, then train with zshard on thread ranks (host backend). Extra
# arguments go to the trainer (try --help).
#   scripts/run_example.sh [trainer options]              the GPT (02_train_gpt) on the built-in
#                                                         synthetic corpus, 4 thread ranks
#   scripts/run_example.sh --mpi N [trainer options]      N MPI processes, started with mpirun
#   scripts/run_example.sh --model llama --init-from DIR [options]
#                                                         a Hugging Face Llama (06_train_llama):
#                                                         fine-tuned with the prompt masked,
#                                                         --export DIR writes it back
# --model (gpt or llama) and --mpi N may come in either order, before the trainer's options.
# Threads and MPI give the same losses bit for bit ("final loss bits" line of the GPT).
set -euo pipefail
cd "$(dirname "$0")/.."
mpi_ranks=""
program=02_train_gpt
while [ $# -gt 0 ]; do
  case "$1" in
    --mpi)
      [[ "${2:-}" =~ ^[1-9][0-9]*$ ]] || { echo "usage: $0 [--model gpt|llama] [--mpi N] [trainer options]" >&2; exit 2; }
      mpi_ranks=$2
      shift 2
      ;;
    --model)
      case "${2:-}" in
        gpt) program=02_train_gpt ;;
        llama) program=06_train_llama ;;
        *) echo "$0: --model takes gpt or llama, not '${2:-}'" >&2; exit 2 ;;
      esac
      shift 2
      ;;
    *) break ;;
  esac
done
bash scripts/setup.sh
cmake --preset dev >/dev/null
cmake --build --preset dev -j "$(nproc)" --target "$program"
if [ -z "$mpi_ranks" ]; then
  exec "./build/dev/examples/$program" "$@"
fi
# Open MPI: start more processes than cores (--oversubscribe) and, in containers run as root,
# say so (--allow-run-as-root). Other MPIs take plain `mpirun -n N`.
launcher=(mpirun -n "$mpi_ranks")
if mpirun --version 2>/dev/null | grep -q "Open MPI"; then
  launcher+=(--oversubscribe)
  [ "$(id -u)" -eq 0 ] && launcher+=(--allow-run-as-root)
fi
exec "${launcher[@]}" "./build/dev/examples/$program" --mpi "$@"
