#!/usr/bin/env bash
# The test command: set-up, then build and run ctest in the CI preset and the sanitizer
# presets. Usage: scripts/test.sh [preset...]   (default: ci asan tsan)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# Python's safetensors and numpy (PyPI) for the checkpoint interoperability test
# (tests/checkpoint/python); created once, reused while it imports both.
venv=build/pyenv
if ! "$venv/bin/python3" -c "import safetensors, numpy" 2>/dev/null; then
  echo "test: creating $venv (safetensors, numpy)"
  if ! { python3 -m venv "$venv" && "$venv/bin/pip" install -q --disable-pip-version-check safetensors numpy; }; then
    echo "test: WARNING: could not create $venv; the checkpoint_python test will report itself skipped"
  fi
fi
presets=("$@")
((${#presets[@]})) || presets=(ci asan tsan)
jobs=$(nproc)
for p in "${presets[@]}"; do
  echo "==== preset $p ===="
  cmake --preset "$p" >/dev/null
  cmake --build --preset "$p" -j "$jobs"
  ctest --preset "$p" -j "$jobs"
done
