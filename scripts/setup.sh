#!/usr/bin/env bash
# Idempotent set-up: installs the Debian packages zshard's build needs, only if missing.
# Used by both README commands and by .ci/run.
set -euo pipefail
packages=(cmake ninja-build ccache g++ make libeigen3-dev doctest-dev nlohmann-json3-dev python3 python3-venv libopenmpi-dev openmpi-bin)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup: all packages present"
fi
