#!/usr/bin/env bash
# Installs dependencies, builds cedar and runs every test (CTest drives GoogleTest and e2e tests).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/build.sh
cd "${CEDAR_BUILD_DIR:-build}"
ctest --output-on-failure -j "${CEDAR_JOBS:-$(nproc)}" "$@"
