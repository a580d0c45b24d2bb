#!/usr/bin/env bash
# The main job: set-up, build, then train the example GPT with zshard on 4 thread ranks (host
# backend) on the built-in synthetic corpus. Extra arguments go to the trainer (try --help).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake --preset dev >/dev/null
cmake --build --preset dev -j "$(nproc)" --target 02_train_gpt
exec ./build/dev/examples/02_train_gpt "$@"
