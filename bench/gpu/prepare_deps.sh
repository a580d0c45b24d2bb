#!/usr/bin/env bash
# Copies the header-only libraries bench/gpu/run.sh needs and a GPU machine may lack into
# .gpu_deps (git-ignored): doctest (the GPU tests) and Eigen (the GPT test's host reference). Run
# it where they are installed (Debian: doctest-dev, libeigen3-dev), then carry .gpu_deps to the
# GPU machine with the working tree.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .gpu_deps
for pair in "/usr/include/doctest:doctest" "/usr/include/eigen3:eigen3"; do
  src=${pair%%:*} dst=.gpu_deps/${pair##*:}
  if [[ -d $src ]]; then
    rm -rf "$dst" && cp -r "$src" "$dst" && echo "prepare_deps: $src -> $dst ($(du -sh "$dst" | cut -f1))"
  else
    echo "prepare_deps: $src not found (install it, or run.sh reports what it cannot build)"
  fi
done
