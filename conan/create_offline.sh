#!/usr/bin/env bash
# `conan create` for zshard with nothing fetched from a remote: a private Conan home with every
# remote disabled, and a profile that declares the system's Eigen and doctest (Debian:
# libeigen3-dev, doctest-dev) as [platform_requires]. The test_package then builds and runs.
# Usage: conan/create_offline.sh [path/to/conan]     (scripts/test.sh passes its venv's conan)
set -euo pipefail
conan=${1:-conan}
here=$(cd "$(dirname "$0")" && pwd)
export CONAN_HOME=${CONAN_HOME:-$here/../build/conan_home}
mkdir -p "$CONAN_HOME"
"$conan" profile detect --exist-ok >/dev/null 2>&1
for r in $("$conan" remote list --format=json | python3 -c 'import json,sys; print(" ".join(r["name"] for r in json.load(sys.stdin)))'); do
  "$conan" remote disable "$r" >/dev/null
done

eigen=$(pkg-config --modversion eigen3 2>/dev/null || true)
doctest=$(sed -n 's/^#define DOCTEST_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\).*/\2/p' /usr/include/doctest/doctest.h 2>/dev/null | paste -sd.)
if [ -z "$eigen" ] || [ -z "$doctest" ]; then
  echo "create_offline: Eigen ($eigen) or doctest ($doctest) not found on the system: run scripts/setup.sh" >&2
  exit 1
fi
profile=$CONAN_HOME/profiles/zshard_offline
cat >"$profile" <<PROFILE
include(default)
[settings]
compiler.cppstd=20
build_type=Release
[platform_requires]
eigen/$eigen
doctest/$doctest
PROFILE
echo "create_offline: remotes disabled; platform_requires eigen/$eigen doctest/$doctest"
"$conan" create "$here" --profile:all "$profile" --build=missing
