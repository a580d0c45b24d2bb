#!/usr/bin/env bash
# The test command: set-up, then each step in turn. Usage: scripts/test.sh [step...]
#   ci, asan, tsan  build and run ctest in that CMake preset (warnings are errors there)
#   plain           a plain `cmake -B build/plain -DCMAKE_BUILD_TYPE=Release` build of the
#                   examples and tests, as a user without presets does, and its ctest. The ci
#                   step compiles with the same flags (plus -Werror), so its objects come from
#                   the compiler cache (build/ccache) when ci ran first in the same checkout
#   consumer        install-only configure + `cmake --install`, then a tiny project that
#                   find_package(zshard)s the installed copy, builds and trains
#   conan           `conan create conan/` offline: Eigen and doctest come from the system
# Default: ci asan tsan plain consumer conan. Python packages from PyPI go into one virtual
# environment, build/pyenv: safetensors and numpy (the checkpoint interoperability test),
# matplotlib (tools/plot_memory.py's test) and conan (the conan step).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
steps=("$@")
((${#steps[@]})) || steps=(ci asan tsan plain consumer conan)
jobs=$(nproc)
root=$PWD
venv=$root/build/pyenv

# Created once, reused while it imports everything. Without PyPI the tests that need a module
# report themselves skipped; the conan step fails (it has nothing else to run).
python_venv() {
  local modules="import safetensors, numpy, matplotlib, conan"
  "$venv/bin/python3" -c "$modules" 2>/dev/null && return 0
  echo "test: creating $venv (safetensors, numpy, matplotlib, conan)"
  if ! { python3 -m venv "$venv" &&
    "$venv/bin/pip" install -q --disable-pip-version-check safetensors numpy matplotlib "conan>=2,<3"; }; then
    echo "test: WARNING: could not fill $venv from PyPI; tests that need its modules will report themselves skipped"
  fi
}
python_venv

# The compiler cache, for the two steps whose objects are the same: ci compiles with CMake's
# plain Release flags plus -Werror, which ccache leaves out of its hash (it does not change an
# object: a warning that it would turn into an error failed the ci step already), so the plain
# step's compiles are cache hits. Both steps use Ninja and sit at the same depth under build/,
# with paths hashed relative to the checkout, so their command lines agree. The sanitizer
# steps compile objects no other step shares: no cache there (a miss only costs).
with_ccache() {
  if ! command -v ccache >/dev/null; then
    "$@"
    return
  fi
  CCACHE_DIR="$root/build/ccache" CCACHE_BASEDIR="$root" CCACHE_NOHASHDIR=1 CCACHE_IGNOREOPTIONS="-Werror" \
    CCACHE_MAXSIZE=4G CMAKE_CXX_COMPILER_LAUNCHER=ccache CMAKE_GENERATOR=Ninja "$@"
}

for s in "${steps[@]}"; do
  echo "==== $s ===="
  start=$SECONDS
  case "$s" in
    ci)
      with_ccache cmake --preset ci -DPython3_EXECUTABLE="$venv/bin/python3" >/dev/null
      with_ccache cmake --build --preset ci -j "$jobs"
      ctest --preset ci -j "$jobs"
      ;;
    asan | tsan | dev)
      cmake --preset "$s" -DPython3_EXECUTABLE="$venv/bin/python3" >/dev/null
      cmake --build --preset "$s" -j "$jobs"
      ctest --preset "$s" -j "$jobs"
      ;;
    plain)
      # No preset, no -Werror, -O3 (CMake's Release default), CUDA off (ci compiles it).
      with_ccache ccache --zero-stats >/dev/null 2>&1 || true
      # (a build/plain configured by another generator, e.g. an older checkout's Makefiles, is
      # configured afresh: CMake refuses to change a build folder's generator)
      grep -qs "CMAKE_GENERATOR:INTERNAL=Ninja" build/plain/CMakeCache.txt || rm -rf build/plain
      with_ccache cmake -B build/plain -DCMAKE_BUILD_TYPE=Release -DZSHARD_CUDA=OFF -DZSHARD_BUILD_BENCH=OFF >/dev/null
      with_ccache cmake --build build/plain -j "$jobs"
      with_ccache ccache --show-stats 2>/dev/null | grep -E "^ *(Hits|Misses)" || true
      # (the layout tests only compile-check messages, which the ci step did already)
      ctest --test-dir build/plain -j "$jobs" --output-on-failure -LE layout
      ;;
    consumer)
      cmake --preset install >/dev/null
      rm -rf build/consumer
      cmake --install build/install --prefix build/consumer/prefix >/dev/null
      cmake -S conan/test_package -B build/consumer/build -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_PREFIX_PATH="$root/build/consumer/prefix" >/dev/null
      cmake --build build/consumer/build -j "$jobs"
      ./build/consumer/build/sharded_training
      ;;
    conan)
      bash conan/create_offline.sh "$venv/bin/conan"
      ;;
    *)
      echo "test.sh: unknown step '$s' (ci asan tsan dev plain consumer conan)" >&2
      exit 2
      ;;
  esac
  echo "==== $s: $((SECONDS - start)) s ===="
done
