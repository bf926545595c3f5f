#!/usr/bin/env bash
# Configures and builds cedar into build/ (Release). Extra arguments go to cmake.
#   CEDAR_BUILD_TARGETS="cedar"   build only these targets (scripts/demo.sh builds the binary alone)
#   CEDAR_CCACHE=0                do not compile through ccache even where it is installed
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${CEDAR_BUILD_DIR:-build}
JOBS=${CEDAR_JOBS:-$(nproc)}
launcher=()
if [[ "${CEDAR_CCACHE:-1}" != 0 ]] && command -v ccache >/dev/null 2>&1; then
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" "$@" >/dev/null
targets=()
for t in ${CEDAR_BUILD_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build "$BUILD_DIR" -j "$JOBS" "${targets[@]}"
