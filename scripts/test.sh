#!/usr/bin/env bash
# The test command: set-up, then build and run ctest in the CI preset and the sanitizer
# presets. Usage: scripts/test.sh [preset...]   (default: ci asan tsan)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
presets=("$@")
((${#presets[@]})) || presets=(ci asan tsan)
jobs=$(nproc)
for p in "${presets[@]}"; do
  echo "==== preset $p ===="
  cmake --preset "$p" >/dev/null
  cmake --build --preset "$p" -j "$jobs"
  ctest --preset "$p" -j "$jobs"
done
