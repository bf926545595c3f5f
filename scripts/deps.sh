#!/usr/bin/env bash
# Installs cedar's build dependencies from Debian's packages (needs root or sudo).
set -euo pipefail
PKGS=(build-essential cmake ninja-build pkg-config clang libclang-rt-14-dev
      libhwy-dev nlohmann-json3-dev libcpp-httplib-dev libboost-dev libxxhash-dev libzstd-dev liburing-dev
      libpcre2-dev libicu-dev libpng-dev libjpeg62-turbo-dev libwebp-dev libgif-dev libhiredis-dev redis-server libgtest-dev libgmock-dev libbenchmark-dev libssl-dev curl python3 python3-venv
      libopenmpi-dev openmpi-bin  # expert parallelism over MPI (src/dist, docs/DISTRIBUTED.md)
      python3-jsonschema)  # the independent validator of the constrained-decoding test
missing=()
for p in "${PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q "${missing[@]}"
fi
